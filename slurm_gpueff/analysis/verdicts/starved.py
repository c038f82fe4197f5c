"""2. Starved: kernels ran only part of the time (input pipeline, CPU preprocessing, host overhead, I/O)."""

from __future__ import annotations

from collections.abc import Sequence

from ..figures import GpuFigures
from .base import Context, Rule, Verdict, cpu_case


class Starved(Rule):
    name = "starved"
    severity = "warning"
    threshold = "starved_kernel_pct"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        limit = ctx.thresholds.pct("starved_kernel_pct")
        return [g for g in self.need(ctx.used, "kernel_active") if (g.mean("kernel_active") or 0.0) < limit]

    def verdict(self, ctx: Context, gpus: Sequence[GpuFigures], variant: str | None = None) -> Verdict:
        """Which case, from the job's CPU efficiency (analysis/cpu.py): CPUs saturated, or idle too."""
        variant = {"busy": "saturated", "idle": "idle"}.get(cpu_case(ctx) or "", variant)
        return super().verdict(ctx, gpus, variant)
