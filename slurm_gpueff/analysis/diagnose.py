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

    def first_verdicts(self) -> dict[tuple[str, int], str]:
        """Per GPU (node, index): the rule name of the first verdict that concerns it (none: not a key)."""
        first: dict[tuple[str, int], str] = {}
        for v in self.verdicts:
            for ref in v.gpus:
                first.setdefault(ref, v.name)
        return first

    def gpu_verdicts(self) -> dict[tuple[str, int], str]:
        """Per GPU (node, index): the plain name of the first verdict that concerns it."""
        return {ref: label_of(name) for ref, name in self.first_verdicts().items()}


def gpu_split(figures: JobFigures, diag: Diagnosis) -> dict[str, list[float]] | None:
    """The job's GPUs by their first verdict ("" for a GPU no verdict concerns, in a job with a verdict on
    others): name -> [GPUs, GPU-hours, GPU-hours lost]; None where every GPU has the primary verdict, as in a
    one-GPU job. Why: a verdict concerns GPUs, and a summary that put a job's every GPU-hour under its primary
    verdict said "GPU never used" of a GPU that worked all along. A part of the lost hours (idle, underfilled)
    unknown for the job counts 0 on each GPU, as the job's own lost hours count it, so the parts add up to
    the job's figures."""
    primary = diag.primary
    if primary is None or figures.gpu_count < 2:
        return None
    first = diag.first_verdicts()
    names = [first.get((g.node, g.index), "") for g in figures.gpus]
    if all(name == primary.name for name in names):
        return None
    idle_known, under_known = figures.waste.idle_h is not None, figures.waste.underfilled_h is not None
    split: dict[str, list[float]] = {}
    for g, name in zip(figures.gpus, names, strict=True):
        part = split.setdefault(name, [0, 0.0, 0.0])
        part[0] += 1
        part[1] += g.hours or 0.0
        part[2] += ((g.waste.idle_h or 0.0) if idle_known else 0.0) + (
            (g.waste.underfilled_h or 0.0) if under_known else 0.0)
    return split


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
