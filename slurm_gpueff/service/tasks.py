"""What the service runs on schedule: :func:`builtin_tasks`. A task is a function ``task(ctx) -> str`` (a
one-line summary for the log); a task that raises is logged and runs again at its next time.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.engine import Engine
from sqlmodel import col

from ..config import Config
from ..errors import GpueffError
from ..models import Job, JobGpu, JobGpuTimeline, not_live, utcnow

log = logging.getLogger("gpueff.serve")


@dataclass(frozen=True)
class TaskRun:
    """A task's last run as ``/v1/health``, ``gpueff doctor --role service`` and /metrics show it. The wall
    clock's times (epoch) are for people; ages and lateness use the monotonic ones, which a clock step (NTP,
    an administrator's ``date -s``) leaves alone. Replaced whole at each change, never changed in place:
    the API's thread reads it while a task's thread writes it."""

    start: float  # time.time() when the run started
    start_mono: float  # time.monotonic() then
    end: float | None = None  # None while it runs
    end_mono: float | None = None
    ok: bool | None = None  # None while it runs
    error: str | None = None  # what failed, in a few words (the log has the whole of it)
    previous: TaskRun | None = None  # while it runs: the run before it, finished


@dataclass
class Context:
    config: Config
    engine: Engine
    last_ok: dict[str, float] = field(default_factory=dict)  # task -> epoch of last success (metrics)
    last_error: dict[str, float] = field(default_factory=dict)
    runs: dict[str, TaskRun] = field(default_factory=dict)  # task -> its last run (started)
    started_mono: float = field(default_factory=time.monotonic)  # when the service began scheduling
    started: float = field(default_factory=time.time)
    schedule: list[Task] = field(default_factory=list)  # what the scheduler runs (set by serve)
    clock_steps: int = 0  # steps of the wall clock seen (the scheduler's jobs were put back on time)
    last_clock_step_s: float | None = None
    damage: str | None = None  # what the integrity check found wrong with the database; None: sound
    stopped: set[str] = field(default_factory=set)  # tasks that said, once, that they stop for the damage
    # Called by the background work between its batches (summarizing, enrich), before each card and before an
    # alert pass: the API's make_way (nodes' waiting pushes and users' questions go first); else nothing.
    make_way: Callable[[], None] = field(default=lambda: None)

    summarizing: int = 0  # tasks analysing stored jobs now (summarize_pending), which cards wait for
    # Set when the service is asked to stop: the long tasks (enrich, the analysis) end at their next batch
    # instead of working through a whole backlog while the stop waits for them.
    leaving: threading.Event = field(default_factory=threading.Event)

    def analyse(self) -> int:
        """summarize_pending in this task, counted in ``summarizing`` while it runs."""
        from .summarize import summarize_pending

        with _COUNTING:
            self.summarizing += 1
        try:
            return summarize_pending(self.engine, self.config.analysis, self.make_way, self.leaving.is_set)
        finally:
            with _COUNTING:
                self.summarizing -= 1


_COUNTING = threading.Lock()


@dataclass
class Task:
    """``interval_s`` (> 0) or ``cron`` (APScheduler CronTrigger fields, e.g. {"day": 1, "hour": 6})."""

    name: str
    func: Callable[[Context], str | None]
    interval_s: float | None = None
    cron: dict[str, Any] | None = None
    at_start: bool = True  # also once right after start (the integrity check runs before anything instead)


class TaskFailed(GpueffError):
    """A run that failed for a reason said in a few words that name no job, user or database: /v1/health,
    which anyone may read, shows them as the run's error."""


UNAVAILABLE = "the job database is unavailable"


# ------------------------------------------------------------------------------------------ built-ins
CHECK = "database_check"  # the one task that still runs on a damaged database: it finds it sound again


def database_check(ctx: Context) -> str:
    """The whole database checked, bounded by ``[service] integrity_limit_s``: one damaged page is met only
    by what reads it, so a command may run on a file that is losing jobs. On damage the other tasks stop
    (:func:`run_task`) and the API answers 503, with one line, until a check finds the file sound again
    (restored from a backup); SQLite's file also gets the mark that stops every command (storage/integrity.py)."""
    from ..storage import integrity
    from ..storage.db import check_engine
    from ..storage.dburl import database_url, safe_url, sqlite_file

    name = safe_url(ctx.config.paths.database)
    state, detail = check_engine(ctx.engine, ctx.config.service.integrity_limit_s)
    path = sqlite_file(database_url(ctx.config.paths.database))
    if path:
        try:
            integrity.record(path, state, detail)
        except OSError as exc:
            log.warning("database check: the damage mark beside %s cannot be changed: %s", path, exc)
    if state == "damaged":
        if ctx.damage is None:  # said to whoever asks the API: no database name, no path
            ctx.damage = f"the job database is damaged ({detail[:300]})"
            log.error("job database %s is damaged (%s): every task stops and the API answers 503 until it is "
                      "restored from a backup (then `gpueff db check`, or the next daily check)", name, detail[:300])
        return "damaged"
    if ctx.damage is not None and state == "ok":
        log.info("job database %s is sound again: the tasks resume", name)
        ctx.damage = None
        ctx.stopped.clear()
    return detail


def ingest(ctx: Context) -> str:
    from ..access.spool_trust import configured_trust
    from ..storage.ingest import ingest_spool

    res = ingest_spool(ctx.engine, ctx.config.paths.spool_dir, trust=configured_trust(ctx.config))
    for e in res.errors:
        log.warning("ingest: %s", e)
    if res.unavailable:  # its records wait in the spool; the log line above says why
        raise TaskFailed(f"{UNAVAILABLE}: {res.failed} record(s) wait in the spool")
    analysed = ctx.analyse()  # also records forwarded by nodes
    return f"ingested {res.ingested}, quarantined {res.quarantined}, failed {res.failed}, analysed {analysed}"


def enrich(ctx: Context) -> str:
    from ..slurm.commands import shard_counter
    from ..slurm.runner import SlurmRunner
    from ..slurm.sacct import SacctReader
    from ..storage.enrich import enrich_jobs

    if not ctx.config.sacct.accounting:
        return "skipped: [sacct] accounting = false (what the Epilog saw is final)"
    since = utcnow() - timedelta(days=ctx.config.sacct.enrich_window_days)
    res = enrich_jobs(ctx.engine, SacctReader.from_config(ctx.config), since=since,
                      settle_s=ctx.config.sacct.settle_s,
                      shard_counts=shard_counter(SlurmRunner.from_config(ctx.config)), stop=ctx.leaving.is_set,
                      between=ctx.make_way)
    for e in res.errors:
        log.warning("enrich: %s", e)
    if res.stopped:
        return f"enriched {res.enriched}, stopped there: the service is stopping (the next run continues)"
    analysed = ctx.analyse()
    return f"enriched {res.enriched}, analysed {analysed}"


def rollups(ctx: Context, full: bool = False) -> str:
    """The months that changed since the last run, or with ``full`` every month."""
    from ..storage.rollups import refresh

    res = refresh(ctx.engine, full=full)
    return f"{len(res.months)} month(s), {res.rows} rows in {res.seconds:.2f} s"


def retention(ctx: Context) -> str:
    """The daily upkeep of the tables themselves: raw timelines past ``timeline_retention_days`` are deleted,
    and on PostgreSQL the planner is told again how many GPU rows a job has, measured from the site's rows
    (storage/planner.py). It is here, not in ``rollups_full``: that one recomputes figures people read, where
    both of these keep the database fit for its queries as it grows; and a day's pace is enough for both (the
    GPU rows a job are a mean over the whole history, which one day's jobs move little)."""
    from ..storage.planner import job_gpu_distinct

    days = ctx.config.service.timeline_retention_days
    if days <= 0:
        done = "timelines are kept forever (service.timeline_retention_days = 0)"
    else:
        done = f"deleted {prune_timelines(ctx.engine, utcnow() - timedelta(days=days))} timeline(s)"
    distinct = job_gpu_distinct(ctx.engine)
    return done if distinct is None else f"{done}; {distinct.line()}"


def prune_timelines(engine: Engine, before: datetime, batch: int = 5000) -> int:
    """Delete raw timelines of jobs that ended before ``before`` (figures and summaries stay)."""
    gone = 0
    while True:
        with engine.begin() as conn:
            ids = [r[0] for r in conn.execute(
                select(col(JobGpuTimeline.job_gpu_id)).join(JobGpu, col(JobGpu.id) == JobGpuTimeline.job_gpu_id)
                .join(Job, col(Job.id) == JobGpu.job_pk).where(col(Job.end_time) < before, not_live()).limit(batch))]
            if not ids:
                return gone
            conn.execute(delete(JobGpuTimeline).where(col(JobGpuTimeline.job_gpu_id).in_(ids)))
            gone += len(ids)


# The longest a card waits for the analysis of stored jobs: long enough to let a batch of summaries through,
# short enough that cards still come while a long analysis (an outage's backlog) runs.
CARD_WAIT_S = 10.0


def after_analysis(ctx: Context, max_s: float = CARD_WAIT_S) -> None:
    """Before a card: the nodes' waiting pushes (make_way), then the analysis while it runs, at most ``max_s``.
    A card is mail, minutes late is no harm; its rendering (queries, templates, and its chart in the chart
    process) takes CPU the stores and the analysis need, which the backlog after an outage is waiting on."""
    ctx.make_way()
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline and ctx.summarizing:
        time.sleep(0.05)


def report_cards(ctx: Context) -> str:
    from ..reports import runner

    if not ctx.config.reports.cards:
        return "skipped: reports.cards is off"
    # it retries due failures first, once
    return f"cards: {runner.send_cards(ctx.config, ctx.engine, between=partial(after_analysis, ctx))}"


def report_monthly(ctx: Context) -> str:
    from ..reports import runner

    if not ctx.config.reports.monthly:
        return "skipped: reports.monthly is off"
    return f"monthly: {runner.send_monthly(ctx.config, ctx.engine)}"


def alerts(ctx: Context) -> str:
    from .alerts import run_alerts

    ctx.make_way()  # a pass is seconds of this process's interpreter at a large site: pushes and questions first
    return f"alerts: {run_alerts(ctx.engine, ctx.config)}"


def builtin_tasks(config: Config) -> list[Task]:
    """The built-in tasks with the schedules from ``[service]`` (an interval of 0 disables a task)."""
    s = config.service
    out = [Task(CHECK, database_check, s.integrity_interval_s, at_start=False),
           Task("ingest", ingest, s.ingest_interval_s), Task("enrich", enrich, s.enrich_interval_s),
           Task("rollups", rollups, s.rollup_interval_s),
           Task("rollups_full", partial(rollups, full=True), s.rollup_full_interval_s),
           Task("retention", retention, s.retention_interval_s),
           Task("report_cards", report_cards, s.cards_interval_s),
           Task("report_monthly", report_monthly, cron={"day": 1, "hour": s.monthly_report_hour})]
    if config.alerts.enabled:  # the idle-GPU policy over running jobs ([alerts]; off by default)
        out.append(Task("alerts", alerts, config.alerts.interval_s))
    return [t for t in out if t.cron is not None or (t.interval_s or 0) > 0]


def run_task(ctx: Context, task: Task) -> None:
    """Run one task with logging and the bookkeeping that /v1/health and /metrics show; never raises. On a
    damaged database only the integrity check runs: the others say once that they stop (each such turn is
    a run that failed: the schedule is kept, the task is not late)."""
    previous = ctx.runs.get(task.name)
    if previous is not None and previous.end is None:
        previous = previous.previous
    run = TaskRun(time.time(), time.monotonic(), previous=previous)
    ctx.runs[task.name] = run
    ok, error = _run(ctx, task, run.start_mono)
    end = time.time()
    ctx.runs[task.name] = TaskRun(run.start, run.start_mono, end, time.monotonic(), ok, error)
    (ctx.last_ok if ok else ctx.last_error)[task.name] = end


def _run(ctx: Context, task: Task, t0: float) -> tuple[bool, str | None]:
    """(whether the task succeeded, what failed in a few words); its log lines."""
    from sqlalchemy.exc import OperationalError

    from ..storage.db import first_line

    if ctx.damage is not None and task.name != CHECK:
        if task.name not in ctx.stopped:
            ctx.stopped.add(task.name)
            log.error("task %s stopped: %s", task.name, ctx.damage)
        return False, "stopped: the job database is damaged"
    try:
        summary = task.func(ctx)
    except OperationalError as exc:  # locked, the server down: the database's state, not a bug; one line
        log.error("task %s failed after %.1f s: the job database is unavailable: %s", task.name,
                  time.monotonic() - t0, first_line(exc))
        return False, UNAVAILABLE
    except GpueffError as exc:  # explained in one line (a spool that is no folder): no traceback
        log.error("task %s failed after %.1f s: %s", task.name, time.monotonic() - t0, exc)
        return False, str(exc) if isinstance(exc, TaskFailed) else type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - logged; the next run tries again
        log.exception("task %s failed after %.1f s", task.name, time.monotonic() - t0)
        return False, type(exc).__name__
    log.info("task %s: %s (%.2f s)", task.name, summary or "done", time.monotonic() - t0)
    return True, None
