"""1b. GPU almost idle: some kernel ran, but under the never-used threshold. Not "never used", which says
that no kernel ever ran; judged per GPU like it, and the CPU side says what the job did instead."""

from __future__ import annotations

from collections.abc import Sequence

from ..figures import GpuFigures
from .base import Context, Rule, Verdict, cpu_case


class NearlyIdle(Rule):
    name = "nearly_idle"
    severity = "critical"
    threshold = "never_used_kernel_pct"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        limit = ctx.thresholds.pct("never_used_kernel_pct")
        return [g for g in self.need(ctx.used, "kernel_active") if 0.0 < (g.mean("kernel_active") or 0.0) < limit]

    def verdict(self, ctx: Context, gpus: Sequence[GpuFigures], variant: str | None = None) -> Verdict:
        """Which case, from the job's CPU efficiency (as Starved): CPUs busy (the work ran there), or idle."""
        variant = {"busy": "cpu_busy", "idle": "cpu_idle"}.get(cpu_case(ctx) or "", variant)
        return super().verdict(ctx, gpus, variant)
