"""1. GPU never used: no kernel ever ran on it (kernel activity 0; a GPU with a little is "almost idle",
nearly_idle.py). Judged per GPU over all the job's GPUs: in "asked for 4 GPUs, used 1" the job mean would
hide it."""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, Rule


class NeverUsed(Rule):
    name = "never_used"
    severity = "critical"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        return [g for g in self.need(ctx.figures.gpus, "kernel_active") if g.mean("kernel_active") == 0.0]
