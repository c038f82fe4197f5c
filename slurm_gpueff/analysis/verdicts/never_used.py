"""1. GPU never used: kernel activity under ``never_used_kernel_pct`` on a GPU for the whole job.

Judged per GPU, because the common case is "asked for 4 GPUs, used 1": the job mean would hide it.
GPUs flagged here are left out of every later check (an idle GPU is not also "starved").
"""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, Rule


class NeverUsed(Rule):
    name = "never_used"
    severity = "critical"
    threshold = "never_used_kernel_pct"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        limit = ctx.thresholds.pct("never_used_kernel_pct")
        return [g for g in self.need(ctx.figures.gpus, "kernel_active") if (g.mean("kernel_active") or 0.0) < limit]
