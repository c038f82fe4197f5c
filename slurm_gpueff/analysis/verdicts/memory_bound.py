"""5. Memory-bound: DRAM bandwidth busy, tensor cores mostly idle (moving data rather than computing)."""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, Rule, Values


class MemoryBound(Rule):
    name = "memory_bound"
    severity = "info"

    def check(self, ctx: Context) -> tuple[Values, list[GpuFigures]] | None:
        measured = self.need(ctx.used, "dram_active", "tensor_active")
        th = ctx.thresholds
        hit = [g for g in measured
               if (g.mean("dram_active") or 0.0) >= th.pct("memory_bound_dram_pct")
               and (g.mean("tensor_active") or 0.0) < th.pct("memory_bound_tensor_pct")]
        if not hit:
            return None
        return self.values(ctx, hit), hit
