"""Job look-ups on any database, as the read model's rows (readmodel.py): by the ids users name (``123``,
``123_4``, ``123+1``; rules in storage/jobmatch.py) with their runs, GPU rows and timelines. Many jobs at once
(a seff-gpu table, a month): storage/summaries.py. The tables are read with SQLAlchemy Core, column by
column into the rows, not as ORM objects: a reader never holds a row it could write back."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Select, or_, select
from sqlmodel import Session

from ..models import Job, JobGpuTimeline
from ..readmodel import GpuRow, JobRow, Points, gpu_row, job_row
from ..slurm.jobid import JobSpec
from .jobmatch import ORDER, Cond, RawIds, find, run_order

JOB = Job.metadata.tables["job"]
GPU = Job.metadata.tables["job_gpu"]
TIMELINE = Job.metadata.tables[JobGpuTimeline.__tablename__]


def job_rows(session: Session, stmt: Select[tuple[object, ...]]) -> list[JobRow]:
    """The job rows a SELECT of the whole ``job`` table gives, in its order."""
    return [job_row(r._mapping) for r in session.connection().execute(stmt)]


def find_jobs(session: Session, spec: JobSpec | RawIds, cluster: str | None = None) -> list[JobRow]:
    """Jobs matching a parsed job id, in ``cluster`` or in every cluster; empty list when none."""

    def run(any_of: Sequence[Cond], all_of: Sequence[Cond]) -> list[JobRow]:
        stmt = select(JOB).where(or_(*(JOB.c[c] == v for c, v in any_of)), *(JOB.c[c] == v for c, v in all_of))
        if cluster is not None:
            stmt = stmt.where(JOB.c.cluster == cluster)
        return job_rows(session, stmt.order_by(*(JOB.c[c] for c in ORDER)))

    return find(spec, run)


def job_runs(session: Session, job: JobRow) -> list[JobRow]:
    """Every run of ``job``'s job (a requeued job has a row per run; docs/DESIGN.md, "Runs"), ``job`` included,
    in :func:`run_order`."""
    return sorted(job_rows(session, select(JOB).where(JOB.c.cluster == job.cluster, JOB.c.job_id == job.job_id)),
                  key=run_order)


def job_gpus(session: Session, job: JobRow) -> list[GpuRow]:
    """The job's GPUs, by node then GPU index."""
    return job_gpu_rows(session, [job.id] if job.id is not None else [])


def gpu_timelines(session: Session, gpus: Sequence[GpuRow]) -> dict[int, Points]:
    """Coarse timelines by ``job_gpu.id`` (``[[t_offset_s, k, s, t], ...]``); GPUs without one are absent."""
    ids = [g.id for g in gpus if g.id is not None]
    if not ids:
        return {}
    rows = session.connection().execute(select(TIMELINE.c.job_gpu_id, TIMELINE.c.points)
                                        .where(TIMELINE.c.job_gpu_id.in_(ids)))
    return {gpu_id: list(points or []) for gpu_id, points in rows}


def job_gpu_rows(session: Session, job_pks: Sequence[int]) -> list[GpuRow]:
    """The GPU rows of many jobs, by node then GPU index within each."""
    if not job_pks:
        return []
    stmt = select(GPU).where(GPU.c.job_pk.in_(job_pks)).order_by(GPU.c.node, GPU.c.gpu_index)
    return [gpu_row(r._mapping) for r in session.connection().execute(stmt)]
