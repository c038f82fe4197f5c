"""6. Oversized: little GPU memory used and few SMs active; a smaller GPU or a MIG slice would do (on a shared
GPU: fewer shards)."""

from __future__ import annotations

from collections.abc import Sequence

from ..figures import GpuFigures
from .base import Context, Rule, Verdict, shared_gpus


class Oversized(Rule):
    name = "oversized"
    severity = "info"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "memory_fraction", "sm_active")
        th = ctx.thresholds
        return [g for g in measured
                if (g.memory_fraction or 0.0) < th.pct("oversized_memory_pct")
                and (g.mean("sm_active") or 0.0) < th.pct("oversized_sm_pct")]

    def verdict(self, ctx: Context, gpus: Sequence[GpuFigures], variant: str | None = None) -> Verdict:
        """On a GPU the job held a share of, the advice is a smaller share."""
        return super().verdict(ctx, gpus, "shared" if shared_gpus(gpus) else variant)
