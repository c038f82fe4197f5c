"""Cumulative time integrals: the arithmetic shared by the node agent and the hook-side collector.

Per metric, three running totals: ``sum`` (value x seconds), ``covered_s`` (seconds that had a value) and
``count`` (readings). A window's mean is ``delta(sum) / delta(covered_s)``: exact however uneven the
sampling, and a metric missing for part of the window is averaged over the part it covered, not diluted.
"""

from __future__ import annotations

import math

from ..record import FRACTIONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any, TypedDict

    class Counters(TypedDict):  # the three running totals, each per metric
        sum: dict[str, float]
        covered_s: dict[str, float]
        count: dict[str, int]

# Everything the agent integrates: the record's fractions plus power in watts (for mean power).
METRICS: tuple[str, ...] = FRACTIONS + ("power_w",)
TIMELINE_METRICS: tuple[str, ...] = ("kernel_active", "sm_active", "tensor_active")


def new_counters() -> Counters:
    return {"sum": dict.fromkeys(METRICS, 0.0), "covered_s": dict.fromkeys(METRICS, 0.0),
            "count": dict.fromkeys(METRICS, 0)}


def published(counters: Mapping[str, Any], metrics: tuple[str, ...]) -> dict[str, Any]:
    """The counters of ``metrics`` as the agent publishes them (sums and seconds rounded to 6 places)."""
    def r(v: float) -> float | None:
        return round(v, 6) if math.isfinite(v) else None

    return {"sum": {m: r(counters["sum"][m]) for m in metrics},
            "covered_s": {m: r(counters["covered_s"][m]) for m in metrics},
            "count": {m: counters["count"][m] for m in metrics}}


def add(counters: Counters, metric: str, value: float | None, dt: float | None) -> bool:
    """Add ``value`` held for ``dt`` seconds; None, NaN, infinities and non-positive dt are skipped."""
    if value is None or dt is None or not (dt > 0) or not math.isfinite(value) or not math.isfinite(dt):
        return False
    counters["sum"][metric] += value * dt
    counters["covered_s"][metric] += dt
    counters["count"][metric] += 1
    return True


def window(start: Mapping[str, Any], end: Mapping[str, Any], metric: str) -> tuple[float | None, float, int]:
    """(mean, covered seconds, readings) of ``metric`` between two counter snapshots; mean None if none."""
    try:
        ds = float(end["sum"][metric]) - float(start["sum"][metric])
        dc = float(end["covered_s"][metric]) - float(start["covered_s"][metric])
        dn = int(end["count"][metric]) - int(start["count"][metric])
    except (KeyError, TypeError, ValueError):
        return None, 0.0, 0
    if dc <= 1e-9 or dn <= 0:
        return None, max(dc, 0.0), max(dn, 0)
    return ds / dc, dc, dn


def clamp_fraction(v: float) -> float:
    """Fractions may overshoot [0,1] by float rounding; clip tiny overshoots."""
    return min(1.0, max(0.0, v))


def timeline_points(snapshots: list[tuple[float, Mapping[str, Any]]], t0: float,
                    max_points: int = 100) -> list[list[float | None]]:
    """Difference ``(epoch, counters)`` snapshots in time order into ``[t_offset_s, kernel, sm, tensor]`` points,
    each one bucket's mean at its midpoint relative to ``t0``. Beyond ``max_points`` buckets, neighbours are
    merged by adding their deltas, so merged means stay exact."""
    buckets: list[tuple[float, float, dict[str, tuple[float, float]]]] = []
    for (ta, a), (tb, b) in zip(snapshots, snapshots[1:], strict=False):
        if tb <= ta:
            continue
        d = {}
        for m in TIMELINE_METRICS:
            try:
                d[m] = (float(b["sum"][m]) - float(a["sum"][m]),
                        float(b["covered_s"][m]) - float(a["covered_s"][m]))
            except (KeyError, TypeError, ValueError):
                d[m] = (0.0, 0.0)
        buckets.append((ta, tb, d))
    if not buckets:
        return []
    group = max(1, math.ceil(len(buckets) / max_points))
    out: list[list[float | None]] = []
    for i in range(0, len(buckets), group):
        chunk = buckets[i:i + group]
        ta, tb = chunk[0][0], chunk[-1][1]
        point: list[float | None] = [round((ta + tb) / 2 - t0, 1)]
        for m in TIMELINE_METRICS:
            s = sum(c[2][m][0] for c in chunk)
            cov = sum(c[2][m][1] for c in chunk)
            point.append(round(clamp_fraction(s / cov), 4) if cov > 1e-9 else None)
        out.append(point)
    return out
