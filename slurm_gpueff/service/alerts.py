"""``gpueff serve``'s idle-GPU policy pass (``[alerts]``): gather, decide (analysis/idle.py), act, audit.

One pass: record each running job's newest live figures as a sample (models.LiveSample; samples of jobs
that have ended are dropped), ask ``squeue`` which of them Slurm still runs and how (batch or interactive,
partition, QOS, which run), decide per job, then act: a warning mail to the owner (at most
``max_mails_per_user_per_day`` delivered a day: a warning that did not reach anyone spends nothing), and
only where ``[alerts] cancel = true`` the cancel, with the reason written to the job's AdminComment first so
that ``sacct -o AdminComment`` shows why.

Mail that fails for a while (the server down, 4xx) is tried again at the next pass. An address the server
refuses with 5xx ("550 User unknown") is backed off: after its n-th refusal in a row its next warning waits
``interval_s`` x 2^(n-1), at most a day, and the first refusal is reported once to ``[reports] admins``
(the reports' sent-log, kind ``refused``, keeps it to once per address). The audit keeps each attempt's
outcome, from which the backoff is read again at every pass. Every decision that changes something and every action
goes to the audit table ``alert_log`` with what was seen and how it went (``gpueff alerts log``).
``dry_run`` (``[alerts] dry_run`` or ``gpueff alerts run --dry-run``) decides and audits the same way,
marked as a dry run, and neither mails nor cancels; a dry run's steps never hold back a real one.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from html import escape
from typing import TYPE_CHECKING

from sqlalchemy import delete, insert
from sqlalchemy import select as rows_of
from sqlmodel import Session, col, select

from ..analysis import idle
from ..fmt import job_label
from ..models import LIVE, AlertLog, Job, JobGpu, LiveSample, utcnow
from ..slurm import commands
from ..slurm.commands import SlurmJob
from ..slurm.runner import SlurmCommandError, SlurmRunner

if TYPE_CHECKING:
    from collections.abc import Callable

    from sqlalchemy.engine import Engine

    from ..config import Config

log = logging.getLogger(__name__)


@dataclass
class AlertsResult:
    judged: int = 0
    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        acts = "; ".join(self.actions) or "no action"
        return f"{self.judged} running job(s) looked at: {acts}" + (
            f"; errors: {'; '.join(self.errors)}" if self.errors else "")


def record_samples(session: Session, jobs: list[Job],
                   window_min: float) -> dict[int, dict[tuple[str, int], list[idle.Sample]]]:
    """Store each live job GPU's newest cumulative figures (once per live record); by job, each GPU's samples
    that its window reads (:func:`kept`).

    The running jobs are named to the database by the live rows' own predicate (ix_job_live), not as a list
    of their ids: thousands of parameters cost more to send than the look-ups they ask for. The stored samples
    are read one GPU at a time, streamed in the order of their unique index: a large site holds a window of
    samples for each of tens of thousands of GPUs, and all of them at once as objects were most of the
    service's memory. Samples no window will use again are deleted: a GPU keeps those of one window, however
    long its job runs."""
    conn = session.connection()
    live = rows_of(col(Job.id)).where(LIVE)
    conn.execute(delete(LiveSample).where(col(LiveSample.job_pk).not_in(live)))  # jobs that have ended
    end_of = {j.id: j.end_time for j in jobs}
    fresh: dict[tuple[int, str, int], idle.Sample] = {}  # each GPU's figures at its job's newest live record
    gcols = (col(JobGpu.job_pk), col(JobGpu.node), col(JobGpu.gpu_index), col(JobGpu.measured_s),
             col(JobGpu.start_time), col(JobGpu.end_time), col(JobGpu.kernel_active), col(JobGpu.sm_active))
    for pk, node, index, measured, start, end, kernel, sm in conn.execute(
            rows_of(*gcols).where(col(JobGpu.job_pk).in_(live))):
        as_of = end_of.get(pk)
        cov = measured if measured is not None else (end - start).total_seconds() if end and start else None
        if as_of is not None and cov is not None:
            fresh[(pk, node, index)] = idle.Sample(as_of, cov, None if kernel is None else kernel * cov,
                                                   None if sm is None else sm * cov)
    out: dict[int, dict[tuple[str, int], list[idle.Sample]]] = {}
    new: list[tuple[int, str, int, idle.Sample]] = []
    gone: list[int] = []

    def settle(key: tuple[int, str, int], stored: list[tuple[int | None, idle.Sample]]) -> None:
        """One GPU: its new sample (unless stored already), its window's samples, its outlived ones."""
        smps = [smp for _sid, smp in stored]
        add = fresh.pop(key, None)
        if add is not None and all(smp.as_of != add.as_of for smp in smps):
            new.append((*key, add))
            smps.append(add)
        if not smps:
            return
        base = idle.window_base(smps, window_min)
        gone.extend(sid for sid, smp in stored if sid is not None and base is not None and smp.as_of < base.as_of)
        out.setdefault(key[0], {})[(key[1], key[2])] = kept(smps, base)

    cols = (col(LiveSample.id), col(LiveSample.job_pk), col(LiveSample.node), col(LiveSample.gpu_index),
            col(LiveSample.as_of), col(LiveSample.covered_s), col(LiveSample.kernel_s), col(LiveSample.sm_s))
    order = (col(LiveSample.job_pk), col(LiveSample.node), col(LiveSample.gpu_index), col(LiveSample.as_of))
    stream = rows_of(*cols).where(col(LiveSample.job_pk).in_(live)).order_by(*order)
    key: tuple[int, str, int] | None = None
    group: list[tuple[int | None, idle.Sample]] = []
    for sid, pk, node, index, as_of, cov, kernel_s, sm_s in conn.execute(
            stream.execution_options(stream_results=True, yield_per=STREAM_ROWS)):
        if (pk, node, index) != key:
            if key is not None:
                settle(key, group)
            key, group = (pk, node, index), []
        group.append((sid, idle.Sample(as_of, cov, kernel_s, sm_s)))
    if key is not None:
        settle(key, group)
    for rest in list(fresh):  # GPUs with no stored sample yet
        settle(rest, [])
    if new:
        conn.execute(insert(LiveSample), [
            {"job_pk": pk, "node": node, "gpu_index": index, "as_of": smp.as_of, "covered_s": smp.covered_s,
             "kernel_s": smp.kernel_s, "sm_s": smp.sm_s} for pk, node, index, smp in new])
    for i in range(0, len(gone), DELETE_CHUNK):
        conn.execute(delete(LiveSample).where(col(LiveSample.id).in_(gone[i:i + DELETE_CHUNK])))
    return out


DELETE_CHUNK = 1000  # sample ids per DELETE
STREAM_ROWS = 5000  # stored samples fetched at a time


def kept(samples: list[idle.Sample], base: idle.Sample | None) -> list[idle.Sample]:
    """Of one GPU's samples, those its window reads (analysis/idle.window), oldest first: the oldest (where
    no sample is a window old), the window's base and the newest. The window over them is the window over
    all of them: the base is the newest sample a window older than the newest, and no other sample is
    between it and the edge."""
    ordered = sorted(samples, key=lambda x: x.as_of)
    picked = {id(x): x for x in (ordered[0], base, ordered[-1]) if x is not None}
    return sorted(picked.values(), key=lambda x: x.as_of)


def run_alerts(engine: Engine, config: Config, *, dry_run: bool | None = None, now: datetime | None = None,
               squeue: Callable[[list[int]], dict[int, SlurmJob]] | None = None,
               act: Callable[[str, Job, list[str], bool], str] | None = None) -> AlertsResult:
    """One pass of the policy over the running jobs; never raises for Slurm, mail or one job's trouble."""
    cfg = config.alerts
    dry = cfg.dry_run if dry_run is None else dry_run
    t = now or utcnow()
    res = AlertsResult()
    # Not expired on commit: the pass reads every running job's row after committing the samples, and an
    # expired row is one more query each (thousands at a large site).
    with Session(engine, expire_on_commit=False) as session:
        jobs = list(session.exec(select(Job).where(LIVE)).all())  # by ix_job_live, not the whole history
        samples = record_samples(session, jobs, cfg.window_min)
        session.commit()
        try:
            slurm = (squeue or (lambda ids: commands.squeue_jobs(SlurmRunner.from_config(config), ids)))(
                sorted({j.job_id for j in jobs}))
        except SlurmCommandError as exc:
            res.errors.append(f"squeue: {exc}; nothing decided")
            return res
        audit: dict[tuple[str, int, int], list[idle.Past]] = {}  # each running job's steps so far, oldest first
        # the running jobs named by the live rows' predicate, not as a list of ids (25,000 of them pass SQLite's
        # limit of bound variables, 32,766)
        running = rows_of(col(Job.job_id)).where(LIVE)
        for r in session.exec(select(AlertLog).where(col(AlertLog.job_id).in_(running), AlertLog.dry_run == dry)
                              .order_by(col(AlertLog.at), col(AlertLog.id))).all():
            audit.setdefault((r.cluster, r.job_id, r.run), []).append(idle.Past(r.at, r.action, delivered(r)))
        for job in jobs:
            sj = slurm.get(job.job_id)
            if sj is None or sj.state != "RUNNING" or (sj.run is not None and sj.run != job.run):
                continue  # ended (its final record will come; a requeued job runs another run) or suspended
            res.judged += 1
            rj = idle.RunningJob(job.cluster, job.job_id, job.run, job.user, job.account, job.start_time,
                                 job.end_time or t, sj.partition, sj.qos, sj.interactive, samples.get(job.id or 0, {}))
            past = audit.get((job.cluster, job.job_id, job.run), [])
            d = idle.decide(rj, past, cfg, t)
            if d.action is None:
                continue
            action = d.action
            if action in idle.MAILS and _mails_today(session, job.user, dry, t) >= cfg.max_mails_per_user_per_day:
                action = idle.RATE_LIMITED
                if any(p.action == idle.RATE_LIMITED and t - p.at < timedelta(days=1) for p in past):
                    continue
            held = None if dry or action not in idle.MAILS else held_back(session, config, job.user, t)
            if held is not None:  # not audited: the refusal that started the wait is
                res.actions.append(f"job {job_label(job)}: {action} held back ({held})")
                continue
            seen = d.detail.split("; ")
            outcome = "noted"
            if action in (*idle.MAILS, idle.CANCEL):
                outcome = (act or (lambda a, j, s, dr: perform(config, a, j, s, dr)))(action, job, seen, dry)
            session.add(AlertLog(at=t, cluster=job.cluster, job_id=job.job_id, run=job.run, user=job.user,
                                 account=job.account, action=action, dry_run=dry, detail=d.detail[:2048],
                                 outcome=outcome[:512]))
            session.commit()
            res.actions.append(f"job {job_label(job)}: {action}{' (dry run)' if dry else ''} ({outcome})")
            refusal = next((p for p in outcome.split("; ") if REFUSED in p), None)
            if refusal is not None and not dry:
                res.actions.append(tell_admins(config, session, job, refusal, t))
    return res


REFUSED = "refused permanently"  # in an outcome: the server refused the address itself (5xx)
BACKOFF_MAX_S = 86400.0  # the longest wait between two tries of a refused address
BACKOFF_LOOKBACK = timedelta(days=30)


def held_back(session: Session, config: Config, user: str | None, t: datetime) -> str | None:
    """Why a warning to ``user`` is not mailed now, or None: their address was refused permanently ``n``
    times in a row (the audit's outcomes since its last delivered mail), the last at ``at``, and ``at`` +
    ``interval_s`` x 2^(n-1) (at most a day) is still to come."""
    from ..reports.runner import user_address

    to = user_address(user, config.reports)
    if to is None:
        return None
    rows = session.exec(select(AlertLog.at, AlertLog.outcome).where(
        AlertLog.dry_run == False, col(AlertLog.action).in_((*idle.MAILS, idle.CANCEL)),  # noqa: E712
        AlertLog.at > t - BACKOFF_LOOKBACK, col(AlertLog.outcome).contains(to, autoescape=True))
        .order_by(col(AlertLog.at).desc(), col(AlertLog.id).desc()).limit(64)).all()
    refused, last = 0, None
    for at, outcome in rows:
        parts = (outcome or "").split("; ")
        if f"mailed {to}" in parts:
            break
        if any(p.startswith(f"mail to {to} {REFUSED}") for p in parts):
            refused += 1
            last = last or at
    if last is None:
        return None
    until = last + timedelta(seconds=min(BACKOFF_MAX_S, config.alerts.interval_s * 2 ** (refused - 1)))
    if t >= until:
        return None
    return (f"mail to {to} {REFUSED} {refused} time{'s' if refused > 1 else ''} in a row; next try after "
            f"{until:%Y-%m-%d %H:%M:%S} UTC")


def tell_admins(config: Config, session: Session, job: Job, refusal: str, t: datetime) -> str:
    """Tell ``[reports] admins`` once per address that the server refuses it (the reports' sent-log keeps it
    to once); the outcome in words."""
    from ..reports.pages import render, sentence
    from ..reports.runner import notify_admins, user_address

    to = user_address(job.user, config.reports) or ""
    ctx = {"cluster": job.cluster, "address": to, "user": job.user or "", "job_label": job_label(job),
           "refusal": refusal, "interval_s": f"{config.alerts.interval_s:g}"}
    said = notify_admins(config, session, kind="refused", key=to, subject=sentence("refused_subject", **ctx),
                         text=render("refused.txt.j2", **ctx), now=t, user=job.user)
    return f"admins about {to}: {said}"


def delivered(row: AlertLog) -> bool:
    """Whether an audited warning reached its owner: mailed, or in a dry run written as it would be. A mail
    that failed, had no address, or was held back by [mail] dry_run warned nobody."""
    if row.action not in idle.MAILS:
        return True
    return (row.outcome or "").startswith("mailed") or (row.dry_run and "(dry run)" in (row.outcome or ""))


def _mails_today(session: Session, user: str | None, dry: bool, t: datetime) -> int:
    """Warnings that reached ``user`` in the day before ``t``: one that failed or was refused spent nothing."""
    rows = session.exec(select(AlertLog).where(
        AlertLog.user == user, AlertLog.dry_run == dry, col(AlertLog.action).in_(idle.MAILS),
        AlertLog.at > t - timedelta(days=1))).all()
    return sum(delivered(r) for r in rows)


def perform(config: Config, action: str, job: Job, seen: list[str], dry: bool) -> str:
    """Mail the owner; for a cancel, record the reason in Slurm and cancel first. The outcome in words."""
    parts = []
    if action == idle.CANCEL:
        parts.append("would cancel" if dry else cancel(config, job))
    parts.append(mail(config, action, job, seen, dry))
    return "; ".join(parts)


def cancel(config: Config, job: Job) -> str:
    """AdminComment (the reason, kept by Slurm's accounting), then scancel. The outcome in words."""
    why = (f"slurm-gpueff: cancelled, GPUs idle for {config.alerts.window_min:g} min "
           f"(kernel < {config.alerts.kernel_pct:g} %, SM < {config.alerts.sm_pct:g} %) after two warnings mailed to "
           "the owner")
    slurm = SlurmRunner.from_config(config)
    note = "reason recorded in AdminComment"
    try:
        commands.set_admin_comment(slurm, job.job_id, why)
    except SlurmCommandError as exc:
        note = f"reason not recorded ({exc})"
    try:
        commands.cancel(slurm, job.job_id)
    except SlurmCommandError as exc:
        return f"cancel failed: {exc}"
    return f"cancelled; {note}"


def mail(config: Config, action: str, job: Job, seen: list[str], dry: bool) -> str:
    """The warning (or cancel notice) to the job's owner; written to the reports dir on a dry run."""
    from ..reports.message import Parts, build
    from ..reports.pages import render, sentence
    from ..reports.runner import user_address
    from ..reports.smtp import DeliveryError, send

    to = user_address(job.user, config.reports)
    if to is None:
        return f"no usable address for user {job.user!r} (reports.address_pattern / addresses)"
    ctx = {"cluster": job.cluster, "job_label": job_label(job), "job_id": job.job_id, "user": job.user or "",
           "action": action, "window_min": f"{config.alerts.window_min:g}", "seen": seen, "dry_run": dry,
           "cancel_enabled": config.alerts.cancel, "contact": config.reports.contact}
    text = render("alert.txt.j2", **ctx)
    parts = Parts(subject=sentence("alert_subject", **ctx), text=text, html_mail=f"<pre>{escape(text)}</pre>",
                  html_file="", images={}, name="alert")
    msg = build(parts, sender=config.mail.from_address, to=[to], reply_to=config.mail.reply_to,
                extra_headers={"X-Gpueff-Job": job_label(job), "X-Gpueff-Alert": action})
    if dry or config.mail.dry_run:
        return f"mail to {to} not sent (dry run)"
    try:
        send(config.mail, [to], msg.as_bytes())
    except DeliveryError as exc:
        log.warning("alert mail for job %s to %s failed: %s", job_label(job), to, exc)
        return f"mail to {to} {REFUSED}: {exc}" if exc.refused else f"mail to {to} failed: {exc}"
    return f"mailed {to}"
