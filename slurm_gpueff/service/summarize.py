"""Store each job's analysis summary on its ``job`` row (docs/DESIGN.md, "Summarize"), so that rollups,
metrics and reports aggregate in SQL instead of analysing every job again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Select, bindparam, select, update
from sqlalchemy.engine import Engine
from sqlmodel import Session

from ..analysis.diagnose import assess, gpu_split
from ..analysis.figures import JobFigures, job_figures
from ..analysis.verdicts.base import ThresholdSource
from ..models import utcnow
from ..readmodel import GpuRow, JobRow
from ..storage.queries import JOB, job_gpu_rows, job_rows

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


def summary(job: JobRow, gpus: Sequence[GpuRow], thresholds: ThresholdSource = None) -> dict[str, object]:
    """Analyse one job: its summary columns, as written to its row."""
    fig = job_figures(job, gpus)
    diag = assess(fig, thresholds)
    primary = diag.primary
    return {"gpu_hours": fig.hours, "idle_gpu_hours": fig.waste.idle_h,
            "underfilled_gpu_hours": fig.waste.underfilled_h, "sm_active_gpu_hours": fig.waste.sm_active_h,
            "tensor_active_gpu_hours": _tensor_hours(fig), "kernel_active": fig.mean("kernel_active"),
            "sm_active": fig.mean("sm_active"), "tensor_active": fig.mean("tensor_active"), "energy_j": fig.energy_j,
            "verdict": primary.name if primary else None,
            "verdict_title": primary.title[:128] if primary else None,
            "gpu_verdicts": gpu_split(fig, diag), "analyzed_at": utcnow()}


def pending_query() -> Select[Any]:
    """The next batch of jobs to analyse, oldest first: answered from the partial index ``ix_job_pending``,
    whose predicate its WHERE repeats literally (a bound parameter would not match it)."""
    return select(JOB).where(JOB.c.analyzed_at.is_(None)).order_by(JOB.c.id).limit(BATCH)


def summarize_pending(engine: Engine, thresholds: ThresholdSource = None,
                      between: Callable[[], None] | None = None, stop: Callable[[], bool] | None = None) -> int:
    """Analyse every job whose summary is missing or stale, ``BATCH`` a transaction; return how many.
    ``between`` is called before each batch after the first (the service's: the nodes' waiting pushes go
    first); ``stop``, asked there too: when true, the rest waits for the next run (the service is stopping)."""
    done = 0
    while True:
        if done and stop is not None and stop():
            return done
        if done and between is not None:
            between()
        with Session(engine) as session:
            jobs = job_rows(session, pending_query())
            if not jobs:
                return done
            by_job: dict[int | None, list[GpuRow]] = {}
            for g in job_gpu_rows(session, [j.id for j in jobs if j.id is not None]):
                by_job.setdefault(g.job_pk, []).append(g)
            session.connection().execute(
                update(JOB).where(JOB.c.id == bindparam("pk")),
                [{"pk": job.id, **summary(job, by_job.get(job.id, []), thresholds)} for job in jobs])
            session.commit()
            done += len(jobs)
        if len(jobs) < BATCH:  # none left when this batch was read; later ones wait for the next run
            return done
