"""How ``gpueff serve``'s scheduled tasks are doing: each task's last run and how late its next one is, as
``GET /v1/health`` (service/api.py), ``gpueff doctor --role service`` and /metrics show them.

A task is late by how long it has been due without starting:

- an interval task is due one interval after its last start (before its first, one interval after the
  service began): measured on the monotonic clock, so a step of the wall clock neither hides nor invents
  lateness;
- a cron task (the monthly report) is due at its previous cron time (by the wall clock, as cron is), or
  at the service's start if that came later (every task runs once at start); it is late while it has not
  started since.

Its ``period_s`` (the interval, or the time between the cron times around now) is the yardstick: doctor
FAILs a task late by more than ``LATE_PERIODS`` of them. A task still running counts from its start: one
that hangs is late like one that never runs.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from .tasks import Context, Task, TaskRun

LATE_PERIODS = 3  # doctor FAILs a task more than this many periods late


def _iso(epoch: float | None) -> str | None:
    return None if epoch is None else datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds")


def cron_times(cron: dict[str, Any], now: datetime) -> tuple[datetime | None, datetime | None]:
    """(the last cron time at or before ``now``, the next one after it) of a task's cron fields, in UTC."""
    from apscheduler.triggers.cron import CronTrigger

    trigger = CronTrigger(timezone="UTC", **cron)
    nxt = trigger.get_next_fire_time(None, now + timedelta(seconds=1))
    span = timedelta(minutes=1)
    while span <= timedelta(days=3 * 366):  # widen the window back until it holds a cron time
        first = trigger.get_next_fire_time(None, now - span)
        if first is not None and first <= now:
            while (later := trigger.get_next_fire_time(None, first + timedelta(seconds=1))) is not None \
                    and later <= now:
                first = later
            return first, nxt
        span *= 2
    return None, nxt


def task_report(ctx: Context, task: Task, now: float, now_mono: float) -> dict[str, Any]:
    """One task's line of the report: its schedule, last run, and lateness (seconds, 0 when on time)."""
    run = ctx.runs.get(task.name)
    running = run is not None and run.end is None
    done: TaskRun | None = run.previous if run is not None and running else run
    if task.interval_s:
        period = float(task.interval_s)
        due_mono = (run.start_mono if run is not None else ctx.started_mono) + period
        late = max(0.0, now_mono - due_mono)
        schedule = f"every {period:g} s"
    else:
        prev, nxt = cron_times(task.cron or {}, datetime.fromtimestamp(now, UTC))
        period = (nxt - prev).total_seconds() if prev is not None and nxt is not None else 0.0
        due = max(prev.timestamp() if prev is not None else now, ctx.started)
        late = 0.0 if run is not None and run.start >= due else max(0.0, now - due)
        schedule = f"cron {task.cron}"
    return {
        "task": task.name, "schedule": schedule, "period_s": round(period, 3), "running": running,
        "last_start": _iso(run.start if run else None),
        "age_s": round(now_mono - run.start_mono, 3) if run else None,
        "last_end": _iso(done.end if done else None),
        "took_s": round(done.end_mono - done.start_mono, 3) if done and done.end_mono is not None else None,
        "ok": done.ok if done else None, "error": done.error if done else None,
        "late_s": round(late, 3),
    }


def report(ctx: Context) -> dict[str, Any]:
    """What ``/v1/health`` adds to its status: every scheduled task's line, and the wall clock's steps seen.
    Nothing in it names a job, a user or the database (anyone who reaches the API may ask)."""
    now, now_mono = time.time(), time.monotonic()
    return {"tasks": [task_report(ctx, t, now, now_mono) for t in ctx.schedule],
            "clock_steps": ctx.clock_steps, "last_clock_step_s": ctx.last_clock_step_s}


def late(line: dict[str, Any]) -> bool:
    """Whether a report line's task is more than ``LATE_PERIODS`` periods late (doctor's FAIL)."""
    period = float(line.get("period_s") or 0)
    return period > 0 and float(line.get("late_s") or 0) > LATE_PERIODS * period
