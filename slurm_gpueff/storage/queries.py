"""Job look-ups through the ORM: by the ids users name (``123``, ``123_4``, ``123+1``; rules in
storage/jobmatch.py) with their runs, GPU rows and timelines. Many jobs at once (a seff-gpu table, a month):
storage/summaries.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import or_
from sqlmodel import Session, col, select

from ..models import Job, JobGpu, JobGpuTimeline
from ..slurm.jobid import JobSpec
from .jobmatch import ORDER, Cond, RawIds, find, run_order


def find_jobs(session: Session, spec: JobSpec | RawIds, cluster: str | None = None) -> list[Job]:
    """Jobs matching a parsed job id, in ``cluster`` or in every cluster; empty list when none."""

    def run(any_of: Sequence[Cond], all_of: Sequence[Cond]) -> list[Job]:
        stmt = select(Job).where(or_(*(getattr(Job, c) == v for c, v in any_of)),
                                 *(getattr(Job, c) == v for c, v in all_of))
        if cluster is not None:
            stmt = stmt.where(Job.cluster == cluster)
        return list(session.exec(stmt.order_by(*(col(getattr(Job, c)) for c in ORDER))).all())

    return find(spec, run)


def job_runs(session: Session, job: Job) -> list[Job]:
    """Every run of ``job``'s job (a requeued job has a row per run; docs/DESIGN.md, "Runs"), ``job`` included,
    in :func:`run_order`."""
    return sorted(session.exec(select(Job).where(Job.cluster == job.cluster, Job.job_id == job.job_id)),
                  key=run_order)


def job_gpus(session: Session, job: Job) -> list[JobGpu]:
    """The job's GPUs, by node then GPU index."""
    stmt = select(JobGpu).where(JobGpu.job_pk == job.id).order_by(col(JobGpu.node), col(JobGpu.gpu_index))
    return list(session.exec(stmt).all())


def gpu_timelines(session: Session, gpus: Sequence[JobGpu]) -> dict[int, list[Any]]:
    """Coarse timelines by ``JobGpu.id`` (``[[t_offset_s, k, s, t], ...]``); GPUs without one are absent."""
    ids = [g.id for g in gpus if g.id is not None]
    if not ids:
        return {}
    rows = session.exec(select(JobGpuTimeline).where(col(JobGpuTimeline.job_gpu_id).in_(ids))).all()
    return {r.job_gpu_id: list(r.points or []) for r in rows}
