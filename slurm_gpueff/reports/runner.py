"""Who gets what, and when: the per-job card run, the monthly run and the retry of failed sends.

What ``gpueff report`` and the scheduler call. A run reads analysed jobs only and holds no transaction
during SMTP, so a slow or dead mail server delays reports and never blocks ingest.

Cards (``send_cards``): jobs that ended within ``reports.card_lookback_h``, analysed, with at least
``card_min_gpu_hours`` and (``card_only_unhealthy``) a verdict other than healthy, that have no sent-log
row yet; most wasteful first, so the per-user daily limit keeps the cards that matter. Opted-out users,
users over the limit and users without an address get a ``skipped`` row with the reason (so the job is
not reconsidered on every run). A card waits until sacct enriched the job, so the state it mails is
Slurm's final one (``cards_due.enrich_wait`` bounds the wait).

Monthly summaries go to the users an account's ``[leads]`` names, else (``reports.coordinators_as_leads``)
to its Slurm account coordinators (``sacctmgr``); either way addressed like the cards' owners
(:func:`user_address`). A sacctmgr failure is logged and the configured leads are used alone: it never
stops the summaries.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parseaddr
from html import escape
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session

from ..analysis.diagnose import assess
from ..analysis.figures import job_figures, naive_utc
from ..config import Config, ReportsConfig
from ..fmt import job_label, one_line, visible
from ..models import ReportLog
from ..readmodel import JobRow
from ..storage import summaries
from ..storage.queries import gpu_timelines, job_gpus, job_runs
from . import cards_due, message, sentlog, smtp
from .card import CHART_CID, build_card, clean
from .monthly import build_summary, month_bounds, previous_month
from .pages import Page

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    sent: int = 0
    written: int = 0  # dry-run
    skipped: int = 0
    failed: int = 0
    retried: int = 0
    lines: list[str] = field(default_factory=list)

    def say(self, line: str) -> None:
        """One line of the run's account (printed by `gpueff report`): user names, accounts and subjects come
        from jobs, so a control character in them is written as its escape, never sent to the terminal."""
        self.lines.append(visible(one_line(line)))

    def __str__(self) -> str:  # the summary line: `gpueff report` prints it, the scheduler logs it
        return (f"sent {self.sent}, written (dry-run) {self.written}, skipped {self.skipped}, "
                f"failed {self.failed} (kept for retry), retried {self.retried}")


def user_address(user: str | None, rep: ReportsConfig) -> str | None:
    """A user's mail address: addresses[user], else the pattern; None if unusable. The one rule for everyone
    mailed by user name: card owners, account leads and coordinators, alerted users."""
    if not user:
        return None
    return valid_address(rep.addresses.get(user) or rep.address_pattern.format(user=user))


def valid_address(addr: str | None) -> str | None:
    """One plain address, or None: no display names, lists, spaces or control characters."""
    if not addr or any(c in addr for c in "\r\n\t ,;<>\"") or clean(addr, 320) != addr:
        return None
    name, parsed = parseaddr(addr)
    return parsed if parsed == addr and not name else None


def _valid(addrs: Sequence[str]) -> list[str]:
    return [a for a in map(valid_address, addrs) if a]


def _archive_dir(rep: ReportsConfig, kind: str, when: datetime, slug: str, dry_run: bool) -> str:
    root = os.path.join(rep.dir, "dry-run") if dry_run else rep.dir
    safe = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in slug)
    return os.path.join(root, kind, when.strftime("%Y-%m"), safe)


def render_job_card(session: Session, job: JobRow, config: Config) -> Page:
    gpus = job_gpus(session, job)
    timelines = gpu_timelines(session, gpus)
    fig = job_figures(job, gpus, config.sacct.accounting)
    diag = assess(fig, config.analysis)
    runs = [(r, fig if r.id == job.id else job_figures(r, job_gpus(session, r), config.sacct.accounting))
            for r in job_runs(session, job)]
    return build_card(job, fig, diag, [timelines[g.id] for g in gpus if g.id in timelines], config,
                      runs=runs if len(runs) > 1 else ())


def _deliver(session: Session, row: ReportLog, config: Config, parts: message.Parts, to: list[str], folder: str,
             dry_run: bool, now: datetime, result: RunResult, headers: dict[str, str]) -> None:
    mail = config.mail
    msg = message.build(parts, sender=mail.from_address, to=to, reply_to=mail.reply_to, extra_headers=headers)
    eml = message.archive(folder, parts, msg)
    if dry_run:
        sentlog.finish(session, row, "dry-run", now=now, archive=eml, attempted=False)
        result.written += 1
        result.say(f"wrote {eml}")
        return
    try:
        smtp.send(mail, to, msg.as_bytes())
    except smtp.DeliveryError as exc:
        status = "abandoned" if exc.permanent else "failed"
        sentlog.finish(session, row, status, now=now, reason=str(exc), archive=eml,
                       retry_after_s=mail.retry_after_s, max_attempts=mail.max_attempts)
        result.failed += 1
        result.say(f"{row.kind} {row.subject} to {', '.join(to)}: {status}: {exc}")
        return
    sentlog.finish(session, row, "sent", now=now, archive=eml)
    result.sent += 1
    result.say(f"sent {row.kind} {row.subject} to {', '.join(to)}")


def send_cards(config: Config, engine: Engine, *, dry_run: bool | None = None, now: datetime | None = None,
               limit: int | None = None, between: Callable[[], None] | None = None) -> RunResult:
    """Send (or in dry-run write) the cards of recently ended jobs; see the module docstring for who.

    A real run first retries the failed messages that are due (:func:`retry_failed`): one run is one
    retry, so whoever runs the cards (the service's tick, cron) must not call retry_failed beside it.
    ``between`` is called before each card is rendered (the service's: nodes' pushes and the analysis of
    stored jobs go first; after an outage the backlog's jobs all become due for a card at once)."""
    dry = config.mail.dry_run if dry_run is None else dry_run
    now = now or sentlog.utcnow()
    rep = config.reports
    result = RunResult() if dry else retry_failed(config, engine, now=now)
    with Session(engine) as session:
        optouts = sentlog.opted_out(session, rep.optout_file)
        for job in cards_due.card_candidates(session, config, now, dry, limit):
            subject = f"{job.cluster}:{job.job_id}"
            user = job.user or ""
            skip = None
            addr = user_address(job.user, rep)
            if user in optouts:
                skip = "opted out"
            elif addr is None:
                skip = f"no usable address for user {user!r} (reports.address_pattern / addresses)"
            elif rep.card_max_per_user_per_day and sentlog.cards_in_last_day(session, user, dry, now) >= \
                    rep.card_max_per_user_per_day:
                skip = f"rate limit: {rep.card_max_per_user_per_day} cards per user per day"
            row = sentlog.claim(session, kind="card", subject=subject, dry_run=dry, now=now, job_pk=job.id,
                                user=user or None, recipients=addr or "", status="skipped" if skip else "sending",
                                reason=skip)
            if row is None:  # another runner took it
                continue
            if skip:
                result.skipped += 1
                result.say(f"skipped card {subject} ({user}): {skip}")
                continue
            if between is not None:
                between()
            try:
                parts = message.parts(render_job_card(session, job, config), CHART_CID, "card")
            except Exception as exc:  # a bad row must not stop the other cards
                sentlog.finish(session, row, "abandoned", now=now, reason=f"could not render: {exc}")
                result.failed += 1
                result.say(f"card {subject}: could not render: {exc}")
                continue
            folder = _archive_dir(rep, "cards", naive_utc(job.end_time) or now, f"{job.cluster}-{job_label(job)}",
                                  dry)
            _deliver(session, row, config, parts, [addr], folder, dry, now, result,  # type: ignore[list-item]
                     {"X-Gpueff-Job": f"{job.cluster}:{job_label(job)}"})
    return result


def notify_admins(config: Config, session: Session, *, kind: str, key: str, subject: str, text: str,
                  now: datetime, user: str | None = None) -> str:
    """A plain-text notice to ``[reports] admins``, at most once per ``kind`` and ``key`` (the sent-log's
    claim: a second call finds the row), archived and retried like the cards; the outcome in words."""
    to = _valid(config.reports.admins)
    skip = None if to else "no [reports] admins to tell"
    row = sentlog.claim(session, kind=kind, subject=key, dry_run=config.mail.dry_run, now=now, user=user,
                        recipients=",".join(to), status="skipped" if skip else "sending", reason=skip)
    if row is None:
        return "told before"
    if skip:
        log.warning("%s %s: %s", kind, key, skip)
        return skip
    parts = message.Parts(subject=subject, text=text, html_mail=f"<pre>{escape(text)}</pre>", html_file="",
                          images={}, name=kind)
    result = RunResult()
    _deliver(session, row, config, parts, to, _archive_dir(config.reports, kind, now, key, config.mail.dry_run),
             config.mail.dry_run, now, result, {"X-Gpueff-Notice": kind})
    return result.lines[-1]


def retry_failed(config: Config, engine: Engine, *, now: datetime | None = None) -> RunResult:
    """Re-send failed messages whose next try is due, from their archived .eml."""
    now = now or sentlog.utcnow()
    mail = config.mail
    result = RunResult()
    with Session(engine) as session:
        for row in sentlog.due_retries(session, now):
            to = [a.strip() for a in row.recipients.split(",") if a.strip()]
            try:
                if not row.archive or not os.path.exists(row.archive):
                    raise smtp.DeliveryError(f"archived message {row.archive} is gone", permanent=True)
                smtp.send(mail, to, Path(row.archive).read_bytes())
            except smtp.DeliveryError as exc:
                sentlog.finish(session, row, "abandoned" if exc.permanent else "failed", now=now, reason=str(exc),
                               retry_after_s=mail.retry_after_s, max_attempts=mail.max_attempts)
                result.failed += 1
                result.say(f"retry {row.kind} {row.subject}: {exc}")
                continue
            sentlog.finish(session, row, "sent", now=now)
            result.retried += 1
            result.sent += 1
            result.say(f"sent {row.kind} {row.subject} on retry")
    return result


def _leads(config: Config, account: str, coordinators: dict[str, list[str]]) -> list[str]:
    """The addresses (each once) of the users ``[leads]`` names for the account, else of its Slurm coordinators."""
    users = config.leads.get(account) or coordinators.get(account, [])
    return list(dict.fromkeys(a for a in (user_address(u, config.reports) for u in users) if a))


def account_coordinators(config: Config, result: RunResult) -> dict[str, list[str]]:
    """Every account's coordinators from sacctmgr (when reports.coordinators_as_leads), else {}; a failure
    is logged and noted in ``result``, and the summaries go to the configured leads alone."""
    if not config.reports.coordinators_as_leads:
        return {}
    from ..errors import SlurmCommandError
    from ..slurm.commands import account_coordinators

    try:
        return account_coordinators(config, min(30.0, config.sacct.timeout_s))
    except SlurmCommandError as exc:
        why = f"account coordinators unknown ({exc}): only [leads] get account summaries"
        log.warning("monthly: %s", why)
        result.say(why)
        return {}


def send_monthly(config: Config, engine: Engine, *, month: str | None = None, account: str | None = None,
                 site: bool | None = None, dry_run: bool | None = None, now: datetime | None = None) -> RunResult:
    """Monthly summaries: one per account with leads or coordinators (or just ``account``), plus the
    site-wide one for ``reports.admins``; none for a month without jobs (an empty summary tells nobody
    anything). In dry-run, accounts without leads are written too (addressed to nobody), so a
    site can look at them before configuring leads."""
    dry = config.mail.dry_run if dry_run is None else dry_run
    now = now or sentlog.utcnow()
    month = month or previous_month(f"{now.year}-{now.month:02d}")  # a summary on the 1st is about last month
    start, end = month_bounds(month)
    rep = config.reports
    result = RunResult()
    with Session(engine) as session:
        targets: list[str | None] = [account] if account is not None else [
            *sorted(summaries.accounts_with_jobs(session, start, end) | set(config.leads))]
        coords = account_coordinators(config, result) if any(a not in config.leads for a in targets if a) else {}
        if site or (site is None and account is None):
            targets.append(None)
        for acc in targets:
            to = _leads(config, acc, coords) if acc is not None else _valid(rep.admins)
            label = acc if acc is not None else "*"
            if not to and not dry:
                result.say(f"no recipients for {'account ' + acc if acc else 'the site summary'} "
                                    f"({'[leads] or coordinators' if acc else 'reports.admins'}); not sent")
                continue
            done = f"monthly {month} {label}: already {'written' if dry else 'sent'}"
            if sentlog.logged(session, kind="monthly", subject=f"{month}:{label}", dry_run=dry):
                result.say(done)  # not built again: the service's start-up run over a sent month is quick
                continue
            summary = build_summary(session, config, month, acc)
            if summary.context["jobs"] == 0:  # nothing to say (a new install's first month): never an empty one
                result.say(f"monthly {month} {label}: no jobs ended in the month; nothing sent")
                continue
            row = sentlog.claim(session, kind="monthly", subject=f"{month}:{label}", dry_run=dry, now=now,
                                recipients=",".join(to))
            if row is None:  # another runner claimed it while this one built it
                result.say(done)
                continue
            parts = message.parts(summary, "monthly-chart", "summary")
            folder = _archive_dir(rep, "monthly", start, label if acc is not None else "site", dry)
            _deliver(session, row, config, parts, to or ["undisclosed-recipients:;"], folder, dry, now, result,
                     {"X-Gpueff-Month": month})
    return result
