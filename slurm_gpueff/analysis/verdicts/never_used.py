"""1. GPU never used, judged per GPU over all the job's GPUs: in "asked for 4 GPUs, used 1" the job mean
would hide it."""

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
