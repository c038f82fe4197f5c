"""``gpueff serve``: APScheduler 3 runs the tasks of :mod:`.tasks`; prometheus_client serves /metrics.

Scheduling rules, the same for every task:

- ``max_instances = 1``: a run that is still going when the next is due makes that one skipped, never
  overlapping (two ingests of one spool, two rollups of one month);
- ``coalesce = True`` + ``misfire_grace_time``: runs missed while the process was busy or suspended are
  run once, not once per missed slot;
- every task also runs once right after start (staggered by a few seconds): what was missed while the
  service was down is caught up once (the monthly report too; its sent-log keeps it from repeating);
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
from datetime import datetime, timedelta
from typing import Any

from ..config import Config
from ..errors import GpueffError
from .tasks import CHECK, REGISTRY, Context, Task, builtin_tasks, load_plugins, run_task

log = logging.getLogger("gpueff.serve")


def build_scheduler(ctx: Context, tasks: list[Task]) -> Any:
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.cron import CronTrigger
    from apscheduler.triggers.interval import IntervalTrigger

    grace = max(1, int(ctx.config.service.misfire_grace_s))
    sched = BackgroundScheduler(timezone="UTC", job_defaults={"max_instances": 1, "coalesce": True,
                                                              "misfire_grace_time": grace})
    now = datetime.now().astimezone()
    for n, task in enumerate(tasks):
        trigger = (IntervalTrigger(seconds=task.interval_s) if task.interval_s
                   else CronTrigger(timezone="UTC", **(task.cron or {})))
        sched.add_job(run_task, trigger, args=(ctx, task), id=task.name, name=task.name, replace_existing=True)
        if not task.at_start:
            continue
        # and once soon after start, to catch up after a restart
        sched.add_job(run_task, "date", args=(ctx, task), id=f"{task.name}@start", name=f"{task.name}@start",
                      run_date=now + timedelta(seconds=1 + 2 * n))
    return sched


def serve(config: Config) -> int:
    """Run until SIGTERM/SIGINT (in the main thread: it installs their handlers). Returns the exit status."""
    from ..storage.db import engine_for, first_line
    from ..storage.dburl import safe_url

    try:
        engine = engine_for(config.paths, checking=True)  # SQLite: migrated; server: checked
    except GpueffError:
        raise
    except Exception as exc:  # noqa: BLE001 - server down, damaged file: one line, not a traceback
        raise GpueffError(f"cannot open the job database {safe_url(config.paths.database)}: "
                          f"{first_line(exc)}") from None
    ctx = Context(config, engine)
    builtin = builtin_tasks(config)
    for task in builtin:  # the integrity check (when scheduled at all) before anything reads or writes
        if task.name == CHECK:
            run_task(ctx, task)
    for problem in load_plugins(config):
        log.error(problem)
    tasks = builtin + list(REGISTRY.values())
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

    api = None
    if s.api_listen:
        from . import api as api_mod

        try:
            api = api_mod.start(config, engine, lambda: ctx.damage)
        except (OSError, GpueffError) as exc:
            if server is not None:
                server.shutdown()
            engine.dispose()
            if isinstance(exc, GpueffError):
                raise
            why = exc.strerror or exc
            raise GpueffError(f"cannot listen on [service] api_listen = {s.api_listen}: {why}") from None
        ctx.make_way = api.api.make_way

    def _on_signal(signum: int, _frame: Any) -> None:
        log.info("%s: finishing running tasks, then exiting", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    sched.start()
    for t in tasks:
        log.info("task %s: %s", t.name, f"every {t.interval_s:g} s" if t.interval_s else f"cron {t.cron}")
    try:
        while not stop.wait(1.0):
            pass
    finally:
        if api is not None:
            api_mod.stop(api)
        sched.shutdown(wait=True)
        if server is not None:
            server.shutdown()
        engine.dispose()
        log.info("stopped")
    return 0
