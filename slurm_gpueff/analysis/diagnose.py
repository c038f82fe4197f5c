"""Diagnosis: the verdict rules over a job's figures, in order (docs/DESIGN.md, "Verdicts"). A rule
that lacks a measured figure goes to ``Diagnosis.skipped`` with the reason, so the card can say what
could not be assessed."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..fmt import gpu_hours
from .figures import JobFigures
from .verdicts import RULES, Context, NotAssessed, Skipped, Thresholds, Verdict, label_of
from .verdicts.base import ThresholdSource


@dataclass
class Diagnosis:
    verdicts: list[Verdict] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def primary(self) -> Verdict | None:
        return self.verdicts[0] if self.verdicts else None

    @property
    def not_assessed(self) -> list[Skipped]:
        """The skipped checks, less "healthy" (not called healthy because a check could not run) when
        other checks say why."""
        return [s for s in self.skipped if len(self.skipped) == 1 or s.name != "healthy"]

    def gpu_verdicts(self) -> dict[tuple[str, int], str]:
        """Per GPU (node, index): the plain name of the first verdict that concerns it."""
        first: dict[tuple[str, int], str] = {}
        for v in self.verdicts:
            for ref in v.gpus:
                first.setdefault(ref, label_of(v.name))
        return first


def assess(figures: JobFigures, thresholds: ThresholdSource = None) -> Diagnosis:
    """Verdicts and not-assessed checks. ``thresholds``: ``config.analysis``, a dict, or None (defaults)."""
    th = Thresholds(thresholds)
    if not figures.gpus:
        return Diagnosis([], [Skipped("all", "All checks", "the job had no GPUs")])
    min_h = th["min_gpu_hours"]
    if figures.hours is not None and figures.hours < min_h:
        return Diagnosis([], [Skipped("all", "All checks", f"job too short to judge ({gpu_hours(figures.hours)} "
                                      f"GPU-hours, under analysis.min_gpu_hours = {min_h:g})")])
    short = th["short_job_s"]
    if figures.measured_s is not None and figures.measured_s < short:
        why = (f"job too short to judge: measured {figures.measured_s:.0f} s, under analysis.short_job_s = "
               f"{short:g} s; in so short a window start-up (imports, CUDA initialisation, loading data) "
               "outweighs the work")
        return Diagnosis([], [Skipped("all", "All checks", why)])
    ctx = Context(figures=figures, used=list(figures.gpus), thresholds=th)
    for rule in RULES:
        try:
            gpus = rule.hits(ctx)
        except NotAssessed as exc:
            ctx.skipped.append(Skipped(rule.name, rule.label, str(exc), exc.figure, exc.detail))
            continue
        if not gpus:
            continue
        ctx.raised.append(rule.verdict(ctx, gpus))
        if rule.name in ("never_used", "nearly_idle"):  # the later checks judge the GPUs that worked
            ctx.used = [g for g in ctx.used if all(g is not x for x in gpus)]
    return Diagnosis(ctx.raised, ctx.skipped)
