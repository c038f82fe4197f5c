"""The sent-log, opt-outs and the per-user rate limit (tables ``report_log`` and ``report_optout``).

"Never twice": a message is claimed by inserting its ``report_log`` row (unique per kind, subject and
dry-run flag) and committing *before* any SMTP traffic, so two runners cannot both send it, and a second
run finds the row and moves on. If the process dies between claiming and recording the outcome, the row
stays ``sending`` and is not resent automatically (at most once: a lost card is better than a
duplicate); ``gpueff report status`` lists such rows.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import func
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from ..models import ReportLog, ReportOptOut
from ..models import utcnow as utcnow  # re-exported: reports.runner and tests use sentlog.utcnow

# Rows that count against the rate limit: everything that was (or may have been) delivered or written.
COUNTED = ("sending", "sent", "failed", "dry-run", "abandoned")


def claim(session: Session, *, kind: str, subject: str, dry_run: bool, now: datetime, **fields: object
          ) -> ReportLog | None:
    """Insert and commit the row for a message; None if it exists already (sent, written or skipped)."""
    row = ReportLog(kind=kind, subject=subject, dry_run=dry_run, created_at=now, **fields)  # type: ignore[arg-type]
    session.add(row)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        return None
    session.refresh(row)
    return row


def logged(session: Session, *, kind: str, subject: str, dry_run: bool) -> bool:
    """Whether the message has its row already (sent, written, skipped or being sent): asked before a message
    is built, so that a run over messages already sent builds none of them again."""
    stmt = select(ReportLog.id).where(ReportLog.kind == kind, ReportLog.subject == subject,
                                      ReportLog.dry_run == dry_run)
    return session.exec(stmt).first() is not None


def cards_in_last_day(session: Session, user: str, dry_run: bool, now: datetime) -> int:
    """Cards for ``user`` in the 24 hours before ``now`` (skipped ones do not count)."""
    stmt = select(func.count()).select_from(ReportLog).where(
        ReportLog.kind == "card", ReportLog.user == user, ReportLog.dry_run == dry_run,
        col(ReportLog.status).in_(COUNTED), ReportLog.created_at > now - timedelta(hours=24))
    return int(session.exec(stmt).one())


def opted_out(session: Session, optout_file: str = "") -> set[str]:
    """Users opted out in the database or in ``reports.optout_file`` (one per line; ``#`` comments; a
    missing file names nobody)."""
    users = set(session.exec(select(ReportOptOut.user)).all())
    if optout_file and os.path.exists(optout_file):
        with open(optout_file, encoding="utf-8") as fh:
            users |= {name for line in fh if (name := line.split("#", 1)[0].strip())}
    return users


def set_optout(session: Session, users: Iterable[str], opt_out: bool) -> list[str]:
    """Add (or remove) users; return those whose state changed."""
    changed = []
    for user in users:
        row = session.get(ReportOptOut, user)
        if opt_out and row is None:
            session.add(ReportOptOut(user=user, created_at=utcnow()))
            changed.append(user)
        elif not opt_out and row is not None:
            session.delete(row)
            changed.append(user)
    session.commit()
    return changed


def due_retries(session: Session, now: datetime) -> list[ReportLog]:
    """Failed real sends whose next try is due."""
    stmt = select(ReportLog).where(ReportLog.status == "failed", ReportLog.dry_run == False,  # noqa: E712
                                   col(ReportLog.next_try_at) <= now).order_by(col(ReportLog.id))
    return list(session.exec(stmt).all())


def finish(session: Session, row: ReportLog, status: str, *, now: datetime, reason: str | None = None,
           archive: str | None = None, retry_after_s: float = 0.0, max_attempts: int = 1,
           attempted: bool = True) -> None:
    """Record a message's outcome; a failure gets its next try time (doubling) or is abandoned."""
    if attempted:
        row.attempts += 1
    row.reason = reason[:1024] if reason else None
    if archive is not None:
        row.archive = archive
    row.next_try_at = None
    if status == "failed":
        if row.attempts >= max_attempts:
            status = "abandoned"
        else:
            row.next_try_at = now + timedelta(seconds=retry_after_s * 2 ** max(0, row.attempts - 1))
    if status in ("sent", "dry-run"):
        row.sent_at = now
    row.status = status
    session.add(row)
    session.commit()


def status_counts(session: Session) -> dict[tuple[str, str], int]:
    stmt = select(ReportLog.kind, ReportLog.status, func.count()).group_by(ReportLog.kind, ReportLog.status)
    return {(k, s): int(n) for k, s, n in session.exec(stmt).all()}
