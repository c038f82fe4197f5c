"""3. Busy but not working: a kernel runs most of the time ("100 % GPU utilization") but few SMs do.

The case nvidia-smi cannot see: one block on one SM reads 100 % utilization on an H100 with 131 of
132 SMs idle. Needs SM activity (GPM / DCGM profiling); not assessed without it.
"""

from __future__ import annotations

from typing import Any

from ..figures import GpuFigures
from .base import Context, Rule


class BusyNotWorking(Rule):
    name = "busy_not_working"
    severity = "warning"

    def check(self, ctx: Context) -> tuple[dict[str, Any], list[GpuFigures]] | None:
        measured = self.need(ctx.used, "kernel_active", "sm_active")
        k_min = ctx.thresholds.pct("busy_kernel_pct")
        s_max = ctx.thresholds.pct("busy_sm_pct")
        hit = [g for g in measured
               if (g.mean("kernel_active") or 0.0) >= k_min and (g.mean("sm_active") or 0.0) < s_max]
        if not hit:
            return None
        return self.values(ctx, hit), hit
