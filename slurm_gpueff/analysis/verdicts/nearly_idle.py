"""1b. GPU almost idle: some kernel ran, but under the never-used threshold. Not "never used", which says
that no kernel ever ran; judged per GPU like it, and the CPU side says what the job did instead."""

from __future__ import annotations

from collections.abc import Sequence

from ..figures import GpuFigures
from .base import Context, Rule, Verdict


class NearlyIdle(Rule):
    name = "nearly_idle"
    severity = "critical"
    threshold = "never_used_kernel_pct"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        limit = ctx.thresholds.pct("never_used_kernel_pct")
        return [g for g in self.need(ctx.used, "kernel_active") if 0.0 < (g.mean("kernel_active") or 0.0) < limit]

    def verdict(self, ctx: Context, gpus: Sequence[GpuFigures], variant: str | None = None) -> Verdict:
        """Which case, from the job's CPU efficiency (as Starved): CPUs busy (the work ran there), or idle."""
        eff, th = ctx.figures.cpu.efficiency, ctx.thresholds
        if eff is not None and eff >= th.pct("starved_cpu_busy_pct"):
            variant = "cpu_busy"
        elif eff is not None and eff < th.pct("starved_cpu_idle_pct"):
            variant = "cpu_idle"
        return super().verdict(ctx, gpus, variant)
