"""3. Busy but not working: kernels run ("100 % GPU utilization") but few SMs do, the case nvidia-smi
cannot see. The efficiency clause catches launch-bound loops: on an H100 a Python loop of 1000-element
adds reads kernel-active 33 %, SM-active 0.05 % -- starved by launch overhead *and* underfilled.
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
