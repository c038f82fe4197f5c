"""A job's window on the nvml backend: which readings bound its figures, and how much of it was measured.

The figures are differences of the agent's counters between the reading at the Prolog and the one at the
Epilog (docs/FIGURES.md "The job's window"). Each end is *exact* when the agent took the reading on the
hook's request, else the agent's last reading, and its offset says how long before the hook that was. Where
the agent was down at an end, that end is the hook's own time, and the time the agent was down there is a
gap. The agent publishes the gaps it had (restarts, stalls); ``measured_s`` is the window less its gaps.
"""

from __future__ import annotations

from ..record import MAX_GAPS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DOWN_AT_END = "agent not running at job end"


def job_window(start: dict[str, Any], end: dict[str, Any]) -> dict[str, Any]:
    """The window from the Prolog's and the Epilog's reading descriptions (:func:`reading`)."""
    t0 = start["updated"] if start.get("live") else start["t"]
    t1 = end["updated"] if end.get("live") else end["t"]
    t1 = max(t0, t1)
    gaps = [g for g in end.get("gaps") or [] if _gap_ok(g)]
    if not end.get("live") and isinstance(end.get("updated"), int | float):
        gaps.append([end["updated"], end["t"], DOWN_AT_END])
    clipped = [[max(a, t0), min(b, t1), why] for a, b, why in gaps if min(b, t1) > max(a, t0)][-MAX_GAPS:]
    return {"start": round(t0, 3), "end": round(t1, 3),
            "start_offset_s": round(start["t"] - t0, 3), "end_offset_s": round(end["t"] - t1, 3),
            "start_exact": bool(start.get("exact")), "end_exact": bool(end.get("exact")),
            "gaps": [[round(a, 3), round(b, 3), why[:256]] for a, b, why in clipped], "break": None}


def measured_s(window: dict[str, Any]) -> float:
    """The window's length less the time its gaps cover (overlapping gaps counted once)."""
    total = window["end"] - window["start"]
    covered_by_gaps, reach = 0.0, window["start"]
    for a, b, _why in sorted(window["gaps"]):
        a = max(a, reach)
        if b > a:
            covered_by_gaps += b - a
            reach = b
    return max(0.0, float(total) - covered_by_gaps)


def reading(t: float, state: dict[str, Any] | None, exact: bool, why: str | None, down: str | None) -> dict[str, Any]:
    """What the hook knows of the reading it differences: its own time ``t``, the reading's time, whether
    the agent took it on request (``why`` not), and whether the agent was ``down`` (why) at that moment."""
    updated = (state or {}).get("updated")
    return {"t": t, "updated": updated if isinstance(updated, int | float) else None, "exact": exact and not down,
            "why": why, "live": down is None and isinstance(updated, int | float), "down": down,
            "gaps": (state or {}).get("gaps") or []}


def _gap_ok(g: object) -> bool:
    return (isinstance(g, list) and len(g) == 3 and isinstance(g[0], int | float) and isinstance(g[1], int | float)
            and isinstance(g[2], str) and g[0] <= g[1])
