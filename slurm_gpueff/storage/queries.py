"""Job look-ups through the ORM: by the ids users name (``123``, ``123_4``, ``123+1``; rules in
storage/jobmatch.py) with their GPU rows and timelines, and many jobs at once for ``seff-gpu -u USER``."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import and_, case, exists, func, or_
from sqlmodel import Session, col, select

from ..models import Job, JobGpu, JobGpuTimeline, ran_more_than_once
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


def _table_where(user: str | None, account: str | None, start: datetime | None, end: datetime | None,
                 cluster: str | None, states: list[str] | None, table: Any = None) -> list[Any]:
    """The conditions of a ``seff-gpu -u/-A`` table: jobs that ended in [start, end) (naive UTC; a running
    job's end is its last live record) of the user/account/cluster, in these Slurm states; on ``table``
    (another name of the job table) when given."""
    c = (table if table is not None else Job.metadata.tables["job"]).c
    where: list[Any] = [c.end_time.is_not(None)]
    for column, value in ((c.user, user), (c.account, account), (c.cluster, cluster)):
        if value is not None:
            where.append(column == value)
    if states:
        where.append(c.state.in_(states))
    if start is not None:
        where.append(c.end_time >= start)
    if end is not None:
        where.append(c.end_time < end)
    return where


def list_jobs(session: Session, *, user: str | None = None, account: str | None = None,
              start: datetime | None = None, end: datetime | None = None, cluster: str | None = None,
              states: list[str] | None = None, limit: int | None = None) -> list[Job]:
    """A table's jobs (:func:`_table_where`), oldest first; with ``limit``, the newest ``limit`` of them."""
    stmt = select(Job).where(*_table_where(user, account, start, end, cluster, states))
    if limit is None:
        return list(session.exec(stmt.order_by(col(Job.end_time), col(Job.job_id))).all())
    newest = session.exec(stmt.order_by(col(Job.end_time).desc(), col(Job.job_id).desc()).limit(limit)).all()
    return list(reversed(newest))


def table_totals(session: Session, *, user: str | None = None, account: str | None = None,
                 start: datetime | None = None, end: datetime | None = None, cluster: str | None = None,
                 states: list[str] | None = None) -> dict[str, Any]:
    """A table's totals over all its jobs, in the database (a year of an account is half a million rows):
    what :func:`slurm_gpueff.render.jobs_table.totals` computes from the rows, plus ``rows`` (the lines)."""
    hours = col(Job.gpu_hours)
    counted = and_(hours.is_not(None), hours != 0)

    def weighted(part: Any) -> Any:  # Σ part / Σ GPU-hours over the jobs where part was measured
        return func.sum(case((and_(counted, part.is_not(None)), part))) / func.nullif(
            func.sum(case((and_(counted, part.is_not(None)), hours))), 0)

    cpu = and_(col(Job.total_cpu_s).is_not(None), col(Job.alloc_cpus) != 0, col(Job.elapsed_s) != 0)
    waste = col(Job.idle_gpu_hours) + col(Job.underfilled_gpu_hours)
    # The jobs among the lines: a requeued job has a line per run. Counted DISTINCT, the year of a large
    # account was sorted by job id; instead the lines are counted less those
    # with an earlier run of their job among the lines, looked for only where the job ran more than once
    # (models.ran_more_than_once), as in models.last_run_count.
    where = _table_where(user, account, start, end, cluster, states)
    j = Job.metadata.tables["job"]
    earlier = j.alias("earlier_run")
    repeated = exists().where(earlier.c.cluster == j.c.cluster, earlier.c.job_id == j.c.job_id,
                              earlier.c.run < j.c.run,
                              *_table_where(user, account, start, end, cluster, states, earlier))
    several = ran_more_than_once()
    stmt = select(  # type: ignore[call-overload]  # sqlmodel's select() is typed for a few columns
        func.count(), func.count() - func.sum(case((several, case((repeated, 1), else_=0)), else_=0)),
        func.sum(hours),
        weighted(hours - col(Job.idle_gpu_hours)), weighted(col(Job.sm_active_gpu_hours)),
        weighted(col(Job.tensor_active_gpu_hours)),
        func.sum(case((cpu, col(Job.total_cpu_s)))) / func.nullif(
            func.sum(case((cpu, col(Job.elapsed_s) * col(Job.alloc_cpus)))), 0),
        func.sum(waste), func.sum(col(Job.energy_j)), func.sum(col(Job.gpu_count)),
    ).where(*where)
    rows, jobs, gh, k, s, t, cpu_eff, wasted, energy, gpus = session.exec(stmt).one()
    return {"rows": int(rows), "jobs": int(jobs or 0), "gpu_hours": gh, "kernel_active": k, "sm_active": s,
            "tensor_active": t, "cpu_efficiency": None if cpu_eff is None else min(1.0, float(cpu_eff)),
            "waste_gpu_hours": wasted, "energy_j": energy, "gpus": int(gpus or 0)}
