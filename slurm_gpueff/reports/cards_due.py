"""Which jobs are due a card, and how long a card waits for Slurm's accounting: the card run's query
(reports/runner.py sends them)."""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import and_, exists, func, or_, select
from sqlmodel import Session, col

from ..config import Config
from ..models import Job, ReportLog, last_run_count, not_live
from ..readmodel import JobRow
from ..storage.queries import JOB, job_rows
from ..storage.summaries import WASTED

# A job's card waits for sacct's enrichment (its real final state: the Epilog sees a TIMEOUT or CANCELLED
# job exit 0) at most this long. The service enriches every few minutes (settle_s + enrich_interval_s,
# 7 minutes by default); 6 hours also outlast a slurmdbd restart or upgrade. A job accounting never knows
# (sacct absent on this host, another cluster's job) is then mailed with "ENDED (... Slurm's final state not
# read from accounting yet)".
CARD_ENRICH_WAIT_H = 6.0


def enrich_wait(config: Config) -> timedelta:
    """How long a card waits for a job's enrichment: CARD_ENRICH_WAIT_H, at most half the lookback so
    that the job is still in it when the wait ends; not at all where Slurm keeps no accounting."""
    if not config.sacct.accounting:
        return timedelta(0)
    return timedelta(hours=min(CARD_ENRICH_WAIT_H, config.reports.card_lookback_h / 2))


def card_candidates(session: Session, config: Config, now: datetime, dry_run: bool, limit: int | None = None
                    ) -> list[JobRow]:
    """Jobs due a card (see reports/runner.py), most GPU-hours lost first: enriched ones, so the card's state is
    Slurm's final one, and those still not enriched after :func:`enrich_wait` (their card says the final
    state is pending accounting). A requeued job's card is its last run's (a run that ended by its requeue
    gets none: the card's subject is the job)."""
    rep = config.reports
    logged = exists().where(and_(col(ReportLog.kind) == "card", col(ReportLog.job_pk) == col(Job.id),
                                 col(ReportLog.dry_run) == dry_run))
    stmt = select(JOB).where(col(Job.analyzed_at).is_not(None), col(Job.end_time).is_not(None), not_live(),
                             col(Job.end_time) >= now - timedelta(hours=rep.card_lookback_h),
                             col(Job.gpu_hours) >= rep.card_min_gpu_hours, ~logged,
                             or_(col(Job.enriched).is_(True), col(Job.end_time) < now - enrich_wait(config)),
                             func.coalesce(col(Job.state), "") != "REQUEUED", last_run_count() == 1)
    if rep.card_only_unhealthy:
        stmt = stmt.where(col(Job.verdict).is_not(None), col(Job.verdict) != "healthy")
    stmt = stmt.order_by(WASTED.desc(), col(Job.end_time), col(Job.id))
    if limit:
        stmt = stmt.limit(limit)
    return job_rows(session, stmt)
