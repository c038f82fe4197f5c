"""7. Healthy: every check ran and none found a problem. Not claimed when a check could not run."""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, NotAssessed, Rule


class Healthy(Rule):
    name = "healthy"
    severity = "ok"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        if ctx.raised or not ctx.used:
            return []
        if ctx.skipped:
            raise NotAssessed("not every check could run (see above), so the job is not called healthy")
        return ctx.used
