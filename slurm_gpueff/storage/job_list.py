"""Many jobs at once for ``seff-gpu -u USER``: the summary columns only (no GPU rows, no analysis)."""

from __future__ import annotations

from datetime import datetime

from sqlmodel import Session, col, select

from ..models import Job


def list_jobs(session: Session, *, user: str | None = None, account: str | None = None,
              start: datetime | None = None, end: datetime | None = None, cluster: str | None = None,
              limit: int | None = None) -> list[Job]:
    """Jobs that ended in [start, end) (naive UTC), filtered by user/account/cluster, oldest first."""
    stmt = select(Job).where(col(Job.end_time).is_not(None))
    if user is not None:
        stmt = stmt.where(Job.user == user)
    if account is not None:
        stmt = stmt.where(Job.account == account)
    if cluster is not None:
        stmt = stmt.where(Job.cluster == cluster)
    if start is not None:
        stmt = stmt.where(col(Job.end_time) >= start)
    if end is not None:
        stmt = stmt.where(col(Job.end_time) < end)
    stmt = stmt.order_by(col(Job.end_time), col(Job.job_id))
    if limit is not None:
        stmt = stmt.limit(limit)
    return list(session.exec(stmt).all())
