"""Look jobs up the way users name them: ``123``, ``123_4`` (array task), ``123+1`` (het component).

Rules (kept simple; ``JobSpec`` comes from :func:`slurm_gpueff.jobid.parse`):

- ``123``: the job whose raw id (JobIDRaw) is 123. If that job is itself the array job or het leader
  123 (its ``array_job_id`` or ``het_job_id`` is 123), the id names the whole group, as in ``sacct -j``,
  so every task / component is returned. With no raw match: every task of array 123, else every
  component of het job 123.
- ``123_4``: array task 4 of array 123 (``array_job_id = 123``), or the row with raw id 123 whose
  ``array_task_id`` is 4 (a record that lacks the array id).
- ``123+1``: component 1 of het job 123 (``het_job_id = 123``), or the row with raw id 123 whose
  ``het_job_offset`` is 1.

``cluster`` restricts the search to one cluster; without it, matches from every cluster are returned.
Results are ordered by cluster, array task, het offset and raw id.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import or_
from sqlmodel import Session, col, select

from ..jobid import JobSpec
from ..models import Job, JobGpu, JobGpuTimeline


def _ordered(stmt):  # type: ignore[no-untyped-def]
    return stmt.order_by(col(Job.cluster), col(Job.array_task_id), col(Job.het_job_offset), col(Job.job_id))


def find_jobs(session: Session, spec: JobSpec, cluster: str | None = None) -> list[Job]:
    """Jobs matching a parsed job id (rules in the module docstring); empty list when none."""

    def run(*where) -> list[Job]:  # type: ignore[no-untyped-def]
        stmt = select(Job).where(*where)
        if cluster is not None:
            stmt = stmt.where(Job.cluster == cluster)
        return list(session.exec(_ordered(stmt)).all())

    j = spec.job
    if spec.task is not None:
        return run(or_(Job.array_job_id == j, Job.job_id == j), Job.array_task_id == spec.task)
    if spec.het_offset is not None:
        return run(or_(Job.het_job_id == j, Job.job_id == j), Job.het_job_offset == spec.het_offset)
    raw = run(Job.job_id == j)
    groups = [r for r in raw if r.array_job_id == j or r.het_job_id == j]
    if raw and not groups:
        return raw
    found = run(or_(Job.job_id == j, Job.array_job_id == j, Job.het_job_id == j))
    if raw:
        return found
    array = [r for r in found if r.array_job_id == j]
    return array or [r for r in found if r.het_job_id == j]


def job_gpus(session: Session, job: Job) -> list[JobGpu]:
    """The job's GPUs, by node then GPU index."""
    stmt = select(JobGpu).where(JobGpu.job_pk == job.id).order_by(col(JobGpu.node), col(JobGpu.gpu_index))
    return list(session.exec(stmt).all())


def gpu_timelines(session: Session, gpus: Sequence[JobGpu]) -> dict[int, list]:
    """Coarse timelines by ``JobGpu.id`` (``[[t_offset_s, k, s, t], ...]``); GPUs without one are absent."""
    ids = [g.id for g in gpus if g.id is not None]
    if not ids:
        return {}
    rows = session.exec(select(JobGpuTimeline).where(col(JobGpuTimeline.job_gpu_id).in_(ids))).all()
    return {r.job_gpu_id: list(r.points or []) for r in rows}
