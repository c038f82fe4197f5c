"""The verdicts, one module each, in the order DESIGN.md gives them (the first raised is the primary)."""

from __future__ import annotations

from .base import Context, NotAssessed, Rule, Skipped, Thresholds, Verdict
from .busy_not_working import BusyNotWorking
from .healthy import Healthy
from .memory_bound import MemoryBound
from .nearly_idle import NearlyIdle
from .never_used import NeverUsed
from .oversized import Oversized
from .starved import Starved
from .tensor_idle import TensorIdle

RULES: tuple[Rule, ...] = (NeverUsed(), NearlyIdle(), Starved(), BusyNotWorking(), TensorIdle(), MemoryBound(),
                           Oversized(), Healthy())


def label_of(name: str) -> str:
    """A verdict's plain name ("GPU never used"); the name itself where no rule has it (an old row)."""
    return next((r.label for r in RULES if r.name == name), name)


__all__ = ["RULES", "Context", "NotAssessed", "Rule", "Skipped", "Thresholds", "Verdict", "label_of"]
