"""``gpueff serve``: APScheduler 3 runs the tasks of :mod:`.tasks`; prometheus_client serves /metrics.

Scheduling rules, the same for every task:

- one APScheduler job per task, ``max_instances = 1``: a run that is still going when the next is due makes
  that one skipped, never overlapping (two ingests of one spool, two rollups of one month, two alert passes
  mailing the same warning);
- ``coalesce = True`` + ``misfire_grace_time``: runs missed while the process was busy or suspended are
  run once, not once per missed slot;
- every task's first run is soon after start (staggered by a few seconds), as that same job's first
  ``next_run_time``: what was missed while the service was down is caught up once (the monthly report
  too; its sent-log keeps it from repeating), and the catch-up is the task's run, not a second job beside it;
- the schedule keeps its pace on the monotonic clock: APScheduler 3 keeps its due times in wall-clock
  time, so a step of the wall clock (NTP stepping it back an hour) would stop every interval task for the
  size of the step. :class:`ClockWatch` compares the wall clock with the monotonic one every second; on a
  step, every interval task's next run is put back where the monotonic clock says it is due (one interval
  after its last start), and no interval task starts again within half its interval of its last start (the
  run APScheduler fires at a forward step, before the watch sees it, is not followed by a second one).
  Cron tasks keep their wall-clock times, as cron does;
- each task's last run and lateness are on ``GET /v1/health``, /metrics and ``gpueff doctor --role
  service`` (service/taskhealth.py);
- the database's integrity check runs first, before any other task or the API: on a damaged database only
  it runs, daily, until the file is sound again (tasks.database_check).

With ``[service] api_listen`` set, the read-only API through which users read their jobs (service/api.py)
runs in a thread beside the tasks; it stops with them.

SIGTERM / SIGINT: no new runs start; running ones finish (``shutdown(wait=True)``); exit status 0.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from ..config import Config
from ..errors import GpueffError
from .tasks import CHECK, Context, Task, builtin_tasks, run_task

log = logging.getLogger("gpueff.serve")


STEP_S = 1.0  # a jump of the wall clock against the monotonic one this large is a step (NTP slews far slower)
FIRST_S, STAGGER_S = 1.0, 2.0  # the first runs after start: FIRST_S, then STAGGER_S apart, in the tasks' order


def build_scheduler(ctx: Context, tasks: list[Task]) -> Any:
    """One job per task: its trigger, and (``at_start``) a first run a few seconds after start."""
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    grace = max(1, int(ctx.config.service.misfire_grace_s))
    sched = BackgroundScheduler(timezone="UTC", job_defaults={"max_instances": 1, "coalesce": True,
                                                              "misfire_grace_time": grace})
    ctx.started, ctx.started_mono = time.time(), time.monotonic()  # the first runs count from here
    now = datetime.fromtimestamp(ctx.started, UTC)
    ctx.schedule = list(tasks)
    for n, task in enumerate(tasks):
        trigger = (IntervalTrigger(seconds=task.interval_s, timezone="UTC") if task.interval_s
                   else CronTrigger(timezone="UTC", **(task.cron or {})))
        first = {"next_run_time": now + timedelta(seconds=first_s(task, n))} if task.at_start else {}
        sched.add_job(run_on_pace, trigger, args=(ctx, task), id=task.name, name=task.name, replace_existing=True,
                      **first)
    return sched


def run_on_pace(ctx: Context, task: Task) -> None:
    """The scheduler's run of ``task``, unless it is an interval task that started less than half its interval
    ago (monotonic clock). When the wall clock steps forward, APScheduler fires the task at once, and it may do
    so just before :class:`ClockWatch` sees the step: the run put back one interval after the previous start
    would then come right behind it."""
    last = ctx.runs.get(task.name)
    since = time.monotonic() - last.start_mono if last is not None else None
    if task.interval_s and since is not None and since < task.interval_s / 2:
        log.debug("task %s: not run again %.2f s after its last start", task.name, since)
        return
    run_task(ctx, task)


def first_s(task: Task, n: int) -> float:
    """Seconds after start of the first run of the ``n``-th task (``at_start``): staggered, and never later
    than its interval."""
    return min(FIRST_S + STAGGER_S * n, task.interval_s or float("inf"))


class ClockWatch:
    """Steps of the wall clock, seen as a change of (wall - monotonic): a slew (NTP's usual correction, at
    most 0.5 ms a second) moves it slowly and is followed; a step moves it at once."""

    def __init__(self) -> None:
        self.offset = time.time() - time.monotonic()

    def step(self) -> float:
        """The step since the last call, in seconds (0.0 when none)."""
        offset = time.time() - time.monotonic()
        step, self.offset = offset - self.offset, offset
        return step if abs(step) >= STEP_S else 0.0


def put_back_on_time(sched: Any, ctx: Context, step_s: float) -> None:
    """After a step of the wall clock: every interval task's next run where the monotonic clock says it is
    due, one interval after its last start (before its first, the start-up run's time), run at once if that
    has passed. APScheduler then counts on from there. Cron tasks keep their wall-clock times."""
    now, now_mono = datetime.now(UTC), time.monotonic()
    for n, task in enumerate(ctx.schedule):
        if not task.interval_s or sched.get_job(task.name) is None:
            continue
        run = ctx.runs.get(task.name)
        if run is not None:
            due_mono = run.start_mono + task.interval_s
        else:
            due_mono = ctx.started_mono + (first_s(task, n) if task.at_start else task.interval_s)
        sched.modify_job(task.name, next_run_time=now + timedelta(seconds=max(0.0, due_mono - now_mono)))
    ctx.clock_steps += 1
    ctx.last_clock_step_s = round(step_s, 3)
    log.warning("the wall clock stepped by %+.1f s: the interval tasks' next runs are put back on the monotonic "
                "clock's schedule", step_s)


def serve(config: Config, extra_tasks: Sequence[Task] = ()) -> int:
    """Run until SIGTERM/SIGINT (in the main thread: it installs their handlers). Returns the exit status.
    ``extra_tasks`` run beside the built-in ones: for the scheduling tests, which need a task that counts its
    runs or hangs (tests/taskprobe.py); ``gpueff serve`` passes none."""
    from ..storage.db import engine_for, first_line
    from ..storage.dburl import UNAVAILABLE, safe_url, shown_here

    try:
        engine = engine_for(config.paths, checking=True)  # SQLite: migrated; server: checked
    except Exception as exc:  # noqa: BLE001 - server down, damaged file: one line, not a traceback
        detail = str(exc) if isinstance(exc, GpueffError) else first_line(exc)
        raise GpueffError(f"cannot open the job database {safe_url(config.paths.database)}: {detail}"
                          if shown_here(config) else UNAVAILABLE) from None
    ctx = Context(config, engine)
    from ..reports import charts  # matplotlib only with the first chart

    if config.reports.cards or config.reports.monthly:
        charts.draw_apart()  # off this process's interpreter lock, which the pushes and answers share
    builtin = builtin_tasks(config)
    for task in builtin:  # the integrity check (when scheduled at all) before anything reads or writes
        if task.name == CHECK:
            run_task(ctx, task)
    tasks = builtin + list(extra_tasks)
    sched = build_scheduler(ctx, tasks)
    stop = threading.Event()
    server = None
    s = config.service
    if s.metrics_port:
        from ..config import read_secret
        from .metrics import registry_for
        from .metrics import serve as serve_metrics

        token = read_secret(s.metrics_token_file, "service.metrics_token_file", "the bearer token Prometheus "
                            "sends") if s.metrics_token_file else None
        server, _thread = serve_metrics(registry_for(engine, config, ctx), s.metrics_address, s.metrics_port, token)
        log.info("metrics on http://%s:%d/metrics", s.metrics_address, s.metrics_port)

    api = pushes = None
    if s.api_listen:
        from ..storage.dburl import answer_busy_s
        from . import api as api_mod
        from .taskhealth import report

        # Its own engine: a push waits for a locked database only as long as its node waits for the answer.
        pushes = engine_for(config.paths, create=False, busy_s=answer_busy_s(s.api_timeout_s))
        try:
            api = api_mod.start(config, pushes, lambda: ctx.damage, lambda: report(ctx))
        except (OSError, GpueffError) as exc:
            if server is not None:
                server.shutdown()
            engine.dispose()
            pushes.dispose()
            if isinstance(exc, GpueffError):
                raise
            why = exc.strerror or exc
            raise GpueffError(f"cannot listen on [service] api_listen = {s.api_listen}: {why}") from None
        ctx.make_way = api.api.make_way

    def _on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: finishing running tasks, then exiting", signal.Signals(signum).name)
        ctx.leaving.set()  # the long tasks end at their next batch
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    clock = ClockWatch()
    sched.start()
    for t in tasks:
        log.info("task %s: %s", t.name, f"every {t.interval_s:g} s" if t.interval_s else f"cron {t.cron}")
    try:
        while not stop.wait(1.0):
            step = clock.step()
            if step:
                put_back_on_time(sched, ctx, step)
    finally:
        if api is not None:
            api_mod.stop(api)
        sched.shutdown(wait=True)
        charts.draw_here()  # nothing to stop where charts were drawn in this process
        if server is not None:
            server.shutdown()
        engine.dispose()
        if pushes is not None:
            pushes.dispose()
        log.info("stopped")
    return 0
