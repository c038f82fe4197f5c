"""The verdicts, one module each, in the order DESIGN.md gives them (the first raised is the primary)."""

from __future__ import annotations

from .base import Context, NotAssessed, Rule, Skipped, Thresholds, Verdict
from .busy_not_working import BusyNotWorking
from .healthy import Healthy
from .memory_bound import MemoryBound
from .never_used import NeverUsed
from .oversized import Oversized
from .starved import Starved
from .tensor_idle import TensorIdle

RULES: tuple[Rule, ...] = (NeverUsed(), Starved(), BusyNotWorking(), TensorIdle(), MemoryBound(),
                           Oversized(), Healthy())

__all__ = ["RULES", "Context", "NotAssessed", "Rule", "Skipped", "Thresholds", "Verdict"]
