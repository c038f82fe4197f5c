"""Store each job's analysis summary on its ``job`` row (docs/DESIGN.md, "Summarize"), so that rollups,
metrics and reports aggregate in SQL instead of analysing every job again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from ..analysis.diagnose import assess, gpu_split
from ..analysis.figures import JobFigures, job_figures
from ..analysis.verdicts.base import ThresholdSource
from ..models import Job, JobGpu, utcnow

BATCH = 500  # jobs analysed a transaction


def _tensor_hours(fig: JobFigures) -> float | None:
    """Σ A·t over the job's GPUs; unknown (None) if any GPU's hours or tensor activity is unknown."""
    total = 0.0
    for g in fig.gpus:
        t = g.mean("tensor_active")
        if g.hours is None or t is None:
            return None
        total += g.hours * t
    return total


def apply_summary(job: Job, gpus: Sequence[JobGpu], thresholds: ThresholdSource = None) -> None:
    """Analyse one job and write its summary columns (in memory; the caller commits)."""
    fig = job_figures(job, gpus)
    diag = assess(fig, thresholds)
    primary = diag.primary
    job.gpu_hours = fig.hours
    job.idle_gpu_hours = fig.waste.idle_h
    job.underfilled_gpu_hours = fig.waste.underfilled_h
    job.sm_active_gpu_hours = fig.waste.sm_active_h
    job.tensor_active_gpu_hours = _tensor_hours(fig)
    job.kernel_active = fig.mean("kernel_active")
    job.sm_active = fig.mean("sm_active")
    job.tensor_active = fig.mean("tensor_active")
    job.energy_j = fig.energy_j
    job.verdict = primary.name if primary else None
    job.verdict_title = primary.title[:128] if primary else None
    job.gpu_verdicts = gpu_split(fig, diag)
    job.analyzed_at = utcnow()


def summarize_pending(engine: Engine, thresholds: ThresholdSource = None,
                      between: Callable[[], None] | None = None) -> int:
    """Analyse every job whose summary is missing or stale, ``BATCH`` a transaction; return how many.
    ``between`` is called before each batch after the first (the service's: the nodes' waiting pushes go
    first)."""
    done = 0
    while True:
        if done and between is not None:
            between()
        with Session(engine) as session:
            jobs = session.exec(select(Job).where(col(Job.analyzed_at).is_(None)).order_by(col(Job.id))
                                .limit(BATCH)).all()
            if not jobs:
                return done
            rows = session.exec(select(JobGpu).where(col(JobGpu.job_pk).in_([j.id for j in jobs]))
                                .order_by(col(JobGpu.node), col(JobGpu.gpu_index))).all()
            by_job: dict[int, list[JobGpu]] = {}
            for r in rows:
                by_job.setdefault(r.job_pk, []).append(r)
            for job in jobs:
                apply_summary(job, by_job.get(job.id or 0, []), thresholds)
                session.add(job)
            session.commit()
            done += len(jobs)
        if len(jobs) < BATCH:  # none left when this batch was read; later ones wait for the next run
            return done
