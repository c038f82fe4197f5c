"""What the reports read from the database: SQL only, returning plain data or Job rows.

Figures come from the per-job summary columns (written by :mod:`slurm_gpueff.service.summarize`) through SQL
aggregates, so a month of a large site stays fast. A job belongs to the month in which it *ended* (UTC).
Jobs whose activity was not measured add to "allocated" and "unmeasured", never to idle or active.
GPU-hours are grouped by GPU model, because prices are per model. A requeued job's runs are rows of
their own: their GPU-hours all count, the job once (:func:`~slurm_gpueff.models.last_run_count`).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import Executable, Float, RowMapping, and_, case, cast, exists, func, or_, select
from sqlalchemy.sql.elements import ColumnElement
from sqlmodel import Session, col
from sqlmodel import select as select_model

from ..config import Config
from ..models import Job, ReportLog, last_run_count, not_live

# A job's card waits for sacct's enrichment (its real final state: the Epilog sees a TIMEOUT or CANCELLED
# job exit 0) at most this long. The service enriches every few minutes (settle_s + enrich_interval_s,
# 7 minutes by default); 6 hours also outlast a slurmdbd restart or upgrade. A job accounting never knows
# (sacct absent on this host, another cluster's job) is then mailed with "ENDED (... Slurm's final state not
# read from accounting yet)".
CARD_ENRICH_WAIT_H = 6.0
PARTS = ("allocated", "idle", "underfilled", "active", "tensor", "unmeasured")
WASTED = func.coalesce(col(Job.idle_gpu_hours), 0.0) + func.coalesce(col(Job.underfilled_gpu_hours), 0.0)
GROUPS = {"user": col(Job.user), "account": col(Job.account)}


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
                  ) -> list[tuple[Job, float]]:
    """The jobs that lost the most GPU-hours, each with those hours: jobs that lost some, and not those
    judged healthy (a healthy job's idle minutes are not a loss to act on)."""
    stmt = (select_model(Job, WASTED).where(*_where(start, end, account), col(Job.idle_gpu_hours).is_not(None),
                                            WASTED > 0, or_(col(Job.verdict).is_(None), col(Job.verdict) != "healthy"))
            .order_by(WASTED.desc(), col(Job.id)).limit(limit))
    return [(j, float(w)) for j, w in session.exec(stmt).all()]


def accounts_with_jobs(session: Session, start: datetime, end: datetime) -> set[str]:
    stmt = select(col(Job.account)).where(*_where(start, end, None)).distinct()
    return {r["account"] for r in _rows(session, stmt) if r["account"]}


def enrich_wait(config: Config) -> timedelta:
    """How long a card waits for a job's enrichment: CARD_ENRICH_WAIT_H, at most half the lookback so
    that the job is still in it when the wait ends; not at all where Slurm keeps no accounting."""
    if not config.sacct.accounting:
        return timedelta(0)
    return timedelta(hours=min(CARD_ENRICH_WAIT_H, config.reports.card_lookback_h / 2))


def card_candidates(session: Session, config: Config, now: datetime, dry_run: bool, limit: int | None = None
                    ) -> list[Job]:
    """Jobs due a card (see :mod:`.runner`), most GPU-hours lost first: enriched ones, so the card's state is
    Slurm's final one, and those still not enriched after :func:`enrich_wait` (their card says the final
    state is pending accounting). A requeued job's card is its last run's (a run that ended by its requeue
    gets none: the card's subject is the job)."""
    rep = config.reports
    logged = exists().where(and_(col(ReportLog.kind) == "card", col(ReportLog.job_pk) == col(Job.id),
                                 col(ReportLog.dry_run) == dry_run))
    stmt = select_model(Job).where(col(Job.analyzed_at).is_not(None), col(Job.end_time).is_not(None),
                             not_live(),
                             col(Job.end_time) >= now - timedelta(hours=rep.card_lookback_h),
                             col(Job.gpu_hours) >= rep.card_min_gpu_hours, ~logged,
                             or_(col(Job.enriched).is_(True), col(Job.end_time) < now - enrich_wait(config)),
                             func.coalesce(col(Job.state), "") != "REQUEUED", last_run_count() == 1)
    if rep.card_only_unhealthy:
        stmt = stmt.where(col(Job.verdict).is_not(None), col(Job.verdict) != "healthy")
    stmt = stmt.order_by(WASTED.desc(), col(Job.end_time), col(Job.id))
    if limit:
        stmt = stmt.limit(limit)
    return list(session.exec(stmt).all())
