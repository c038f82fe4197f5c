"""6. Oversized: little GPU memory used and few SMs active; a smaller GPU or a MIG slice would do."""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, Rule


class Oversized(Rule):
    name = "oversized"
    severity = "info"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "memory_fraction", "sm_active")
        th = ctx.thresholds
        return [g for g in measured
                if (g.memory_fraction or 0.0) < th.pct("oversized_memory_pct")
                and (g.mean("sm_active") or 0.0) < th.pct("oversized_sm_pct")]
