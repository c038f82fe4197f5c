"""Continuity of the node agent's counters across its own restarts.

Jobs' figures are differences of the agent's cumulative counters, so an agent that started its counters from
zero after a restart (package upgrade, OOM kill, systemd restart) would void every running job on the node,
multi-day jobs included. The agent therefore resumes the counters its last published state holds when that
state is from the same boot and the same GPU; the time it was down becomes a *gap* that jobs' windows
subtract (docs/FIGURES.md "The job's window"). Each GPU's counters belong to a *series*: a new series (its
counters from zero, and a sentence saying why) starts only where continuity is really lost, so a job whose
window spans two series gets n/a with that sentence.
"""

from __future__ import annotations

import json
import uuid as uuidlib

from ..record import MAX_GAPS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"

FIRST_START = "agent started (no earlier state on this node)"
REBOOTED = "node rebooted"
GPU_RESET = "GPU reset or driver reloaded (its energy counter restarted)"
NEW_GPU = "GPU not in the agent's earlier state"
DIED = "agent not running (killed or crashed)"
STOPPED = "agent stopped"


def boot_id(path: str = BOOT_ID_PATH) -> str | None:
    try:
        with open(path) as fh:
            return fh.read().strip() or None
    except OSError:
        return None


def booted_at(path: str = "/proc/stat") -> float | None:
    """When this node booted (epoch seconds, the kernel's ``btime``), or None where unreadable."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def new_series() -> str:
    return uuidlib.uuid4().hex[:12]


def previous(path: str, version: int, boot: str | None) -> tuple[dict[str, Any] | None, str]:
    """(the earlier state to resume, "") or (None, why each GPU's counters start a new series)."""
    try:
        with open(path, "rb") as fh:
            prev = json.loads(fh.read())
    except FileNotFoundError:
        return None, FIRST_START
    except (OSError, ValueError) as exc:
        return None, f"agent started (its earlier state was unreadable: {exc})"
    if not isinstance(prev, dict) or prev.get("version") != version or not isinstance(prev.get("gpus"), dict):
        return None, "agent started (its earlier state is of another version)"
    if boot is None or prev.get("boot_id") != boot:
        return None, REBOOTED if boot is not None and prev.get("boot_id") else FIRST_START
    if not isinstance(prev.get("updated"), int | float):
        return None, "agent started (its earlier state has no time)"
    return prev, ""


def counters_of(published: dict[str, Any], metrics: tuple[str, ...]) -> dict[str, Any] | None:
    """The counters in a published entry, as the agent keeps them; None when any is malformed."""
    try:
        return {"sum": {m: float(published["sum"][m] or 0.0) for m in metrics},
                "covered_s": {m: float(published["covered_s"][m] or 0.0) for m in metrics},
                "count": {m: int(published["count"][m] or 0) for m in metrics}}
    except (KeyError, TypeError, ValueError):
        return None


def gaps_since(prev: dict[str, Any] | None, keep_from: float) -> list[list[Any]]:
    """The earlier state's gaps that still matter (ending after ``keep_from``), well-formed ones only."""
    out = []
    for g in (prev or {}).get("gaps") or []:
        if (isinstance(g, list) and len(g) == 3 and all(isinstance(x, int | float) for x in g[:2])
                and isinstance(g[2], str) and g[1] >= keep_from):
            out.append(g)
    return out[-MAX_GAPS:]


def add_gap(gaps: list[list[Any]], start: float, end: float, why: str) -> None:
    if end > start:
        gaps.append([round(start, 3), round(end, 3), why])
        del gaps[:-MAX_GAPS]
