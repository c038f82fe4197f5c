"""3. Busy but not working: a kernel runs most of the time ("100 % GPU utilization") but few SMs do.

The case nvidia-smi cannot see: one block on one SM reads 100 % utilization on an H100 with 131 of
132 SMs idle. Needs SM activity (GPM / DCGM profiling); not assessed without it.

Also raised when the kernels that did run filled almost nothing (SM-active / kernel-active below
``busy_efficiency_pct``), however often they ran: on an H100 a Python loop of 1000-element adds reads
kernel-active 33 %, SM-active 0.05 % -- starved by launch overhead *and* underfilled.
"""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, Rule


class BusyNotWorking(Rule):
    name = "busy_not_working"
    severity = "warning"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "kernel_active", "sm_active")
        k_min = ctx.thresholds.pct("busy_kernel_pct")
        s_max = ctx.thresholds.pct("busy_sm_pct")
        eff_max = ctx.thresholds.pct("busy_efficiency_pct")
        k_used = ctx.thresholds.pct("never_used_kernel_pct")

        def busy(g: GpuFigures) -> bool:
            k = g.mean("kernel_active") or 0.0
            s = g.mean("sm_active") or 0.0
            return (k >= k_min and s < s_max) or (k >= k_used and s < eff_max * k)

        return [g for g in measured if busy(g)]
