"""2. Starved: kernels ran only part of the time (input pipeline, CPU preprocessing, host overhead, I/O)."""

from __future__ import annotations

from typing import Any

from ..figures import GpuFigures
from .base import Context, Rule


class Starved(Rule):
    name = "starved"
    severity = "warning"

    def check(self, ctx: Context) -> tuple[dict[str, Any], list[GpuFigures]] | None:
        measured = self.need(ctx.used, "kernel_active")
        limit = ctx.thresholds.pct("starved_kernel_pct")
        low = [g for g in measured if (g.mean("kernel_active") or 0.0) < limit]
        if not low:
            return None
        values = self.values(ctx, low)
        values["thr"] = f"{ctx.thresholds['starved_kernel_pct']:g}%"
        return values, low
