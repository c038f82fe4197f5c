"""1. GPU never used: kernel activity under ``never_used_kernel_pct`` on a GPU for the whole job.

Judged per GPU, because the common case is "asked for 4 GPUs, used 1": the job mean would hide it.
GPUs flagged here are left out of every later check (an idle GPU is not also "starved").
"""

from __future__ import annotations

from ...fmt import pct
from ..figures import GpuFigures
from .base import Context, Rule, Values


class NeverUsed(Rule):
    name = "never_used"
    severity = "critical"

    def check(self, ctx: Context) -> tuple[Values, list[GpuFigures]] | None:
        measured = self.need(ctx.figures.gpus, "kernel_active")
        limit = ctx.thresholds.pct("never_used_kernel_pct")
        idle = [g for g in measured if (g.mean("kernel_active") or 0.0) < limit]
        if not idle:
            return None
        values = self.values(ctx, idle)
        values["thr"] = pct(ctx.thresholds.pct("never_used_kernel_pct"))
        return values, idle
