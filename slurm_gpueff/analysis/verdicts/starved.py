"""2. Starved: kernels ran only part of the time (input pipeline, CPU preprocessing, host overhead, I/O; on a
shared GPU that the other jobs kept busy, its neighbours)."""

from __future__ import annotations

from collections.abc import Sequence

from ..figures import GpuFigures
from .base import Context, Rule, Verdict, cpu_case, shared_gpus

NEIGHBOURS_BUSY = 0.9  # the whole shared GPU's kernel activity from which a job's low share is its neighbours'



class Starved(Rule):
    name = "starved"
    severity = "warning"
    threshold = "starved_kernel_pct"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        limit = ctx.thresholds.pct("starved_kernel_pct")
        return [g for g in self.need(ctx.used, "kernel_active") if (g.mean("kernel_active") or 0.0) < limit]

    def verdict(self, ctx: Context, gpus: Sequence[GpuFigures], variant: str | None = None) -> Verdict:
        """Which case: a shared GPU that other jobs kept busy, else from the job's CPU efficiency
        (analysis/cpu.py): CPUs saturated, or idle too."""
        busy = [g for g in shared_gpus(gpus) if g.shared and (g.shared.gpu_kernel_active or 0.0) >= NEIGHBOURS_BUSY]
        if busy:
            return super().verdict(ctx, gpus, "neighbours")
        variant = {"busy": "saturated", "idle": "idle"}.get(cpu_case(ctx) or "", variant)
        return super().verdict(ctx, gpus, variant)
