"""2. Starved: kernels ran only part of the time (input pipeline, CPU preprocessing, host overhead, I/O)."""

from __future__ import annotations

from ...fmt import pct
from ..figures import GpuFigures
from .base import Context, Rule, Values


class Starved(Rule):
    name = "starved"
    severity = "warning"

    def check(self, ctx: Context) -> tuple[Values, list[GpuFigures]] | None:
        measured = self.need(ctx.used, "kernel_active")
        limit = ctx.thresholds.pct("starved_kernel_pct")
        low = [g for g in measured if (g.mean("kernel_active") or 0.0) < limit]
        if not low:
            return None
        values = self.values(ctx, low)
        values["thr"] = pct(ctx.thresholds.pct("starved_kernel_pct"))
        return values, low
