"""5. Memory-bound: DRAM bandwidth busy, tensor cores mostly idle (moving data rather than computing)."""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, Rule


class MemoryBound(Rule):
    name = "memory_bound"
    severity = "info"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "dram_active", "tensor_active")
        th = ctx.thresholds
        return [g for g in measured
                if (g.mean("dram_active") or 0.0) >= th.pct("memory_bound_dram_pct")
                and (g.mean("tensor_active") or 0.0) < th.pct("memory_bound_tensor_pct")]
