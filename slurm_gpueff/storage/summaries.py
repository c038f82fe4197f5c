"""Many jobs at once from their summary columns (written by :mod:`slurm_gpueff.service.summarize`), through SQL
aggregates so that a year of an account or a month of a large site stays fast: a seff-gpu table's lines and
totals (``seff-gpu -u/-A``), and a month's GPU-hours for the monthly summaries. The rollups keep their own
sums in a table (storage/rollups.py).

A requeued job's runs are rows of their own: their GPU-hours all count, the job once
(:func:`~slurm_gpueff.models.last_run_count`). A month: a job belongs to the month in which it *ended*
(UTC); jobs whose activity was not measured add to "allocated" and "unmeasured", never to idle or active;
GPU-hours are grouped by GPU model, because prices are per model.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from sqlalchemy import Executable, Float, RowMapping, and_, case, cast, exists, func, or_, select, union_all
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, col
from sqlmodel import select as select_model

from ..models import Job, last_run_count, live, not_live, ran_more_than_once
from ..readmodel import JobRow, job_row
from .queries import JOB, job_rows

PARTS = ("allocated", "idle", "underfilled", "active", "tensor", "unmeasured")
WASTED = func.coalesce(col(Job.idle_gpu_hours), 0.0) + func.coalesce(col(Job.underfilled_gpu_hours), 0.0)
GROUPS = {"user": col(Job.user), "account": col(Job.account)}
# The columns a table's totals read (table_totals)
_TOTALLED = ("cluster", "job_id", "run", "gpu_hours", "idle_gpu_hours", "underfilled_gpu_hours", "sm_active_gpu_hours",
             "tensor_active_gpu_hours", "total_cpu_s", "alloc_cpus", "elapsed_s", "energy_j", "gpu_count")


class Split(NamedTuple):
    """GPU-hours of one group (``key``: a user, an account, or None for all) on one GPU model."""

    key: str | None
    gpu_type: str | None
    jobs: int
    hours: dict[str, float]  # PARTS -> GPU-hours


class VerdictPart(NamedTuple):
    """GPUs under one verdict, of one group (``key``: a user or an account, None without ``by``), GPU model
    and user. ``verdict``: each GPU's first verdict (job.gpu_verdicts), "" for a GPU no verdict concerns in a
    job with a verdict on its other GPUs, None for a job not assessed. ``jobs`` counts the jobs with GPUs
    here (a requeued job once): a job whose GPUs differ has a part under each of their verdicts."""

    key: str | None
    verdict: str | None
    gpu_type: str | None
    user: str | None
    gpus: int
    jobs: int
    hours: float
    wasted: float


def _where(start: datetime, end: datetime, account: str | None) -> list[ColumnElement[bool]]:
    cond = [col(Job.end_time) >= start, col(Job.end_time) < end, col(Job.gpu_hours).is_not(None),
            not_live()]  # a running job is summed once it has ended
    if account is not None:
        cond.append(col(Job.account) == account)
    return cond


def _rows(session: Session, stmt: Executable) -> list[RowMapping]:
    return list(session.connection().execute(stmt).mappings())


def split(session: Session, start: datetime, end: datetime, account: str | None, by: str | None = None
          ) -> list[Split]:
    """The split per GPU model, and per user or account (``by``: "user", "account") if given."""
    groups = [GROUPS[by], col(Job.gpu_type)] if by else [col(Job.gpu_type)]
    sums = [func.sum(col(Job.gpu_hours)).label("allocated"), func.sum(col(Job.idle_gpu_hours)).label("idle"),
            func.sum(col(Job.underfilled_gpu_hours)).label("underfilled"),
            func.sum(col(Job.sm_active_gpu_hours)).label("active"),
            func.sum(col(Job.tensor_active_gpu_hours)).label("tensor"),
            func.sum(case((col(Job.sm_active_gpu_hours).is_(None), col(Job.gpu_hours)),
                          else_=cast(0.0, Float))).label("unmeasured")]
    stmt = (select(*groups, func.sum(last_run_count()).label("jobs"), *sums).where(*_where(start, end, account))
            .group_by(*groups))
    return [Split(r[by] if by else None, r["gpu_type"], int(r["jobs"] or 0),
                  {p: float(r[p] or 0.0) for p in PARTS}) for r in _rows(session, stmt)]


def simulated_jobs(session: Session, start: datetime, end: datetime, account: str | None) -> int:
    """How many of the month's jobs were measured on simulated GPUs (the demo, tests): their summary says so."""
    stmt = select(func.sum(last_run_count())).where(*_where(start, end, account), col(Job.backend) == "simulated")
    return int(session.connection().execute(stmt).scalar() or 0)


def verdict_parts(session: Session, start: datetime, end: datetime, account: str | None, by: str | None = None
                  ) -> list[VerdictPart]:
    """The month's GPUs by verdict (:class:`VerdictPart`), per ``by`` ("user", "account") if given. The jobs
    whose GPUs all have their verdict (gpu_verdicts NULL: nearly all) are summed in SQL; the others, few,
    are split here from their stored parts. The parts add up to the month: GPUs, GPU-hours, lost hours."""
    keys: list[Any] = [GROUPS[by].label("key")] if by else []
    uniform = col(Job.gpu_verdicts).is_(None)
    groups = [*keys, col(Job.verdict), col(Job.gpu_type), col(Job.user)]
    stmt = (select(*groups, func.sum(col(Job.gpu_count)).label("gpus"), func.sum(last_run_count()).label("jobs"),
                   func.sum(col(Job.gpu_hours)).label("hours"), func.sum(WASTED).label("wasted"))
            .where(*_where(start, end, account), uniform).group_by(*groups))
    parts = [VerdictPart(r["key"] if by else None, r["verdict"], r["gpu_type"], r["user"], int(r["gpus"] or 0),
                         int(r["jobs"] or 0), float(r["hours"] or 0.0), float(r["wasted"] or 0.0))
             for r in _rows(session, stmt)]
    split = (select(*keys, col(Job.gpu_type), col(Job.user), col(Job.gpu_verdicts), last_run_count().label("last"))
             .where(*_where(start, end, account), ~uniform))
    for r in _rows(session, split):
        for name, (gpus, hours, wasted) in (r["gpu_verdicts"] or {}).items():
            parts.append(VerdictPart(r["key"] if by else None, name, r["gpu_type"], r["user"], int(gpus),
                                     int(r["last"]), float(hours), float(wasted)))
    return parts


def most_wasteful(session: Session, start: datetime, end: datetime, account: str | None, limit: int = 10
                  ) -> list[tuple[JobRow, float]]:
    """The jobs that lost the most GPU-hours, each with those hours: jobs that lost some, and not those
    judged healthy (a healthy job's idle minutes are not a loss to act on)."""
    stmt = (select(JOB, WASTED.label("wasted"))
            .where(*_where(start, end, account), col(Job.idle_gpu_hours).is_not(None), WASTED > 0,
                   or_(col(Job.verdict).is_(None), col(Job.verdict) != "healthy"))
            .order_by(WASTED.desc(), col(Job.id)).limit(limit))
    return [(job_row(r._mapping), float(r.wasted)) for r in session.connection().execute(stmt)]


def accounts_with_jobs(session: Session, start: datetime, end: datetime) -> set[str]:
    stmt = select(col(Job.account)).where(*_where(start, end, None)).distinct()
    return {r["account"] for r in _rows(session, stmt) if r["account"]}


# -- a seff-gpu table ----------------------------------------------------------------------------------

def _table_where(user: str | None, account: str | None, start: datetime | None, end: datetime | None,
                 cluster: str | None, states: list[str] | None, table: Any = None) -> list[Any]:
    """The conditions of a ``seff-gpu -u/-A`` table: jobs that ended in [start, end) (naive UTC; a running
    job's end is its last live record) of the user/account/cluster, in these Slurm states; on ``table``
    (another name of the job table) when given. Finished and running jobs alike: see :func:`_lines`."""
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


def _lines(where: list[Any], *columns: Any) -> Any:
    """A table's lines, finished and running jobs alike, as one subquery of ``columns``: the indexes by end
    time hold finished jobs only (migration 0017), so the finished ones are read there and the running ones
    through ``ix_job_live``, each arm by its own index on either database."""
    return union_all(select(*columns).where(*where, not_live()),
                     select(*columns).where(*where, live())).subquery("lines")


def list_jobs(session: Session, *, user: str | None = None, account: str | None = None,
              start: datetime | None = None, end: datetime | None = None, cluster: str | None = None,
              states: list[str] | None = None, limit: int | None = None) -> list[JobRow]:
    """A table's jobs (:func:`_table_where`), oldest first; with ``limit``, the newest ``limit`` of them: the
    newest finished ones read in order from their index, the running ones beside them, the newest of both."""
    where = _table_where(user, account, start, end, cluster, states)
    if limit is None:
        lines = _lines(where, JOB)
        return job_rows(session, select(lines).order_by(lines.c.end_time, lines.c.job_id))
    finished = (select(JOB).where(*where, not_live()).order_by(JOB.c.end_time.desc(), JOB.c.job_id.desc())
                .limit(limit).subquery())  # a subquery: SQLite takes no ORDER BY or LIMIT in a UNION's arm
    both = union_all(select(finished), select(JOB).where(*where, live())).subquery()
    newest = select(both).order_by(both.c.end_time.desc(), both.c.job_id.desc()).limit(limit)
    return list(reversed(job_rows(session, newest)))


def table_totals(session: Session, *, user: str | None = None, account: str | None = None,
                 start: datetime | None = None, end: datetime | None = None, cluster: str | None = None,
                 states: list[str] | None = None) -> dict[str, Any]:
    """A table's totals over all its jobs, in the database (a year of an account is half a million rows):
    what :func:`slurm_gpueff.render.jobs_table.totals` computes from the rows, plus ``rows`` (the lines)."""
    j = Job.metadata.tables["job"]
    where = _table_where(user, account, start, end, cluster, states)
    c = _lines(where, *(j.c[n] for n in _TOTALLED)).c
    hours = c.gpu_hours
    counted = and_(hours.is_not(None), hours != 0)

    def weighted(part: Any) -> Any:  # Σ part / Σ GPU-hours over the jobs where part was measured
        return func.sum(case((and_(counted, part.is_not(None)), part))) / func.nullif(
            func.sum(case((and_(counted, part.is_not(None)), hours))), 0)

    cpu = and_(c.total_cpu_s.is_not(None), c.alloc_cpus != 0, c.elapsed_s != 0)
    waste = c.idle_gpu_hours + c.underfilled_gpu_hours
    # The jobs among the lines: a requeued job has a line per run. Counted DISTINCT, the year of a large
    # account was sorted by job id; instead the lines are counted less those
    # with an earlier run of their job among the lines, looked for only where the job ran more than once
    # (models.ran_more_than_once), as in models.last_run_count.
    earlier = j.alias("earlier_run")
    repeated = exists().where(earlier.c.cluster == c.cluster, earlier.c.job_id == c.job_id, earlier.c.run < c.run,
                              *_table_where(user, account, start, end, cluster, states, earlier))
    several = ran_more_than_once(c)
    stmt = select_model(  # type: ignore[call-overload]  # sqlmodel's select() is typed for a few columns
        func.count(), func.count() - func.sum(case((several, case((repeated, 1), else_=0)), else_=0)),
        func.sum(hours), weighted(hours - c.idle_gpu_hours), weighted(c.sm_active_gpu_hours),
        weighted(c.tensor_active_gpu_hours),
        func.sum(case((cpu, c.total_cpu_s))) / func.nullif(func.sum(case((cpu, c.elapsed_s * c.alloc_cpus))), 0),
        func.sum(waste), func.sum(c.energy_j), func.sum(c.gpu_count),
    )
    rows, jobs, gh, k, s, t, cpu_eff, wasted, energy, gpus = session.exec(stmt).one()
    return {"rows": int(rows), "jobs": int(jobs or 0), "gpu_hours": gh, "kernel_active": k, "sm_active": s,
            "tensor_active": t, "cpu_efficiency": None if cpu_eff is None else min(1.0, float(cpu_eff)),
            "waste_gpu_hours": wasted, "energy_j": energy, "gpus": int(gpus or 0)}
