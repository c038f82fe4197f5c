"""`gpueff serve`'s schedule: one job per task that never runs twice at once, a pace kept across steps of the
wall clock, each task's last run and lateness on /v1/health, and `gpueff doctor --role service` failing a late
task by name.

The service is a real process, run as `gpueff serve` runs it with one more task, the probe
(tests/taskprobe.py), that counts its runs and hangs on demand. The clock steps are real steps of its wall
clock: the process runs under libfaketime (Debian's libfaketime, tests/setup-services.sh) with
``FAKETIME_DONT_FAKE_MONOTONIC=1``, so only the wall clock moves, as an NTP step moves it, and a timestamp file
the test rewrites steps it by -1 h and +1 h.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import taskprobe
from daemons import QUIET, free_port, start_munged

from slurm_gpueff.access.client import HEALTH_PATH, request
from slurm_gpueff.config import Config
from slurm_gpueff.service import tasks
from slurm_gpueff.service.scheduler import build_scheduler, run_on_pace
from slurm_gpueff.service.taskhealth import late
from slurm_gpueff.storage.db import make_engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
FAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
pytestmark = pytest.mark.process


def test_a_task_never_runs_twice_at_once(tmp_path):
    """The start-up catch-up is the task's own job (its first run soon after start), not a second job beside it:
    with a task that takes longer than its interval, the catch-up and the first scheduled run overlapped
    (a cancel mail and its audit row twice). Real APScheduler, a task that counts its runs going on at once."""
    cfg = Config({"paths": {"spool_dir": str(tmp_path / "spool"), "state_dir": str(tmp_path / "state"),
                            "database": str(tmp_path / "g.db")}})
    ctx = tasks.Context(cfg, make_engine(cfg.paths.database))

    def slow(c: tasks.Context) -> str:
        return taskprobe.probe(c, str(tmp_path), hold_s=1.5)

    sched = build_scheduler(ctx, [tasks.Task("probe", slow, 1.0)])
    jobs = sched.get_jobs()
    assert [j.id for j in jobs] == ["probe"]  # one job per task
    sched.start()
    try:
        deadline = time.monotonic() + 30
        while len(taskprobe.runs(str(tmp_path))) < 3 and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        sched.shutdown(wait=True)
    runs = taskprobe.runs(str(tmp_path))
    assert len(runs) >= 3
    assert max(r["concurrent"] for r in runs) == 1, runs
    assert all(j.max_instances == 1 and j.coalesce for j in jobs)


def serve(tmp_path: Path, service: str = "", env: dict[str, str] | None = None,
          munge_socket: str = "") -> tuple[subprocess.Popen, int, str]:
    """A real service process, as `gpueff serve` runs it, with the probe task (every second: tests/taskprobe.py)
    and its API on a loopback port (with ``munge_socket``, the sealed round trips doctor makes work); (process,
    port, log path) once its health check answers."""
    port = free_port()
    if munge_socket:
        service += f'munge_socket = "{munge_socket}"\n'
    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
                   f'database = "{tmp_path}/db/g.db"\n[service]\nmetrics_port = 0\napi_listen = "127.0.0.1:{port}"\n'
                   f'{QUIET}{service}')
    log = str(tmp_path / "serve.log")
    with open(log, "a") as out:
        proc = subprocess.Popen([sys.executable, os.path.join(TESTS, "taskprobe.py"), str(cfg)], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT, text=True,
                                env={**os.environ, "PYTHONPATH": f"{TESTS}:{ROOT}", "GPUEFF_PROBE_DIR": str(tmp_path),
                                     **(env or {})})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, Path(log).read_text()[-3000:]
        try:
            if request(f"http://127.0.0.1:{port}", "GET", HEALTH_PATH, timeout=5).status == 200:
                return proc, port, log
        except OSError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"serve did not answer: {Path(log).read_text()[-3000:]}")


def stop(proc: subprocess.Popen, log: str) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGCONT)
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return Path(log).read_text()


def health(port: int) -> tuple[int, dict]:
    reply = request(f"http://127.0.0.1:{port}", "GET", HEALTH_PATH, timeout=10)
    return reply.status, json.loads(reply.body)


def wait_runs(folder: str, n: int, timeout_s: float = 30) -> list[dict[str, float]]:
    """The probe's runs once there are ``n``; as many as there are after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while len(taskprobe.runs(folder)) < n and time.monotonic() < deadline:
        time.sleep(0.1)
    return taskprobe.runs(folder)


def step(stamp: Path, offset: str) -> float:
    """Step the served process's wall clock to ``offset`` from the real time; the monotonic time of the step."""
    tmp = stamp.with_suffix(".new")
    tmp.write_text(offset + "\n")
    os.replace(tmp, stamp)
    return time.monotonic()


def test_tasks_keep_their_pace_across_steps_of_the_wall_clock(tmp_path):
    """An NTP step of -1 h stopped every task for an hour (APScheduler 3 keeps its due times in wall-clock
    time); a step of +1 h made them all due at once. The service sees the step against the monotonic clock and
    puts each interval task back where that clock says it is due: the probe (every 1 s) and ingest (every 1 s)
    run on at their pace through a -1 h and a +1 h step, never two at once, and /v1/health says a step was seen
    and nothing is late."""
    if not os.path.exists(FAKETIME):
        pytest.fail(f"{FAKETIME} missing: install Debian's libfaketime (tests/setup-services.sh)")
    stamp = tmp_path / "faketime"
    stamp.write_text("+0\n")
    env = {"LD_PRELOAD": FAKETIME, "FAKETIME_TIMESTAMP_FILE": str(stamp), "FAKETIME_DONT_FAKE_MONOTONIC": "1",
           "FAKETIME_NO_CACHE": "1"}
    proc, port, log = serve(tmp_path, "ingest_interval_s = 1\n", env)
    folder = str(tmp_path)
    try:
        before = len(wait_runs(folder, 3))
        assert before >= 3
        back = step(stamp, "-1h")
        runs = wait_runs(folder, before + 5, timeout_s=20)
        after_back = [r for r in runs if r["mono"] > back]
        assert len(after_back) >= 5, (runs, Path(log).read_text()[-3000:])
        assert min(r["wall"] for r in after_back) < time.time() - 3000  # the served process did see -1 h
        status, body = health(port)
        assert status == 200 and body["clock_steps"] >= 1 and body["last_clock_step_s"] < -3500
        ingest = next(t for t in body["tasks"] if t["task"] == "ingest")
        assert ingest["ok"] and ingest["age_s"] < 5 and not [t for t in body["tasks"] if t["late_s"] > 2], body

        n = len(runs)
        forward = step(stamp, "+0")  # +1 h
        runs = wait_runs(folder, n + 5, timeout_s=20)
        after_forward = [r for r in runs if r["mono"] > forward]
        assert len(after_forward) >= 5, (runs, Path(log).read_text()[-3000:])
        status, body = health(port)
        assert status == 200 and body["clock_steps"] >= 2 and body["last_clock_step_s"] > 3500
        assert not [t for t in body["tasks"] if t["late_s"] > 2], body
    finally:
        out = stop(proc, log)
    gaps = [b["mono"] - a["mono"] for a, b in zip(runs, runs[1:], strict=False)]
    assert max(gaps) < 8.0, gaps  # every second, through both steps (an hour's gap without the fix), loaded or not
    assert min(gaps) > 0.2, gaps  # and no burst of the runs the +1 h step "missed"
    assert max(r["concurrent"] for r in runs) == 1
    assert "the wall clock stepped by -3600" in out and "the wall clock stepped by +3600" in out, out[-3000:]
    assert "Traceback" not in out


def test_a_scheduled_run_right_behind_the_last_start_is_not_made(tmp_path):
    """The race behind a burst at a +1 h step: APScheduler fires the task at once, then the clock watch puts
    its next run one interval after the previous start, which has passed. The scheduler's run is not made
    within half the interval of the last start; after that it is, and a cron task is never held back."""
    cfg = Config({"paths": {"database": str(tmp_path / "g.db"), "spool_dir": str(tmp_path / "spool"),
                            "state_dir": str(tmp_path / "state")}})
    ctx = tasks.Context(cfg, make_engine(cfg.paths.database))
    calls: list[str] = []
    every = tasks.Task("every", lambda _c: calls.append("every") or "ok", 1.0)
    monthly = tasks.Task("monthly", lambda _c: calls.append("monthly") or "ok", cron={"day": 1, "hour": 6})
    run_on_pace(ctx, every)
    run_on_pace(ctx, every)  # 0.0x s later: a burst
    assert calls == ["every"]
    time.sleep(0.6)
    run_on_pace(ctx, every)
    run_on_pace(ctx, monthly)
    run_on_pace(ctx, monthly)
    assert calls == ["every", "every", "monthly", "monthly"]


def test_doctor_fails_a_task_that_is_late_and_names_it(tmp_path):
    """A task that hangs (the probe blocks while a file exists) is late once its next run is due and does not
    start: /v1/health says how late, and `gpueff doctor --role service` FAILs naming it once it is more than
    3 intervals late; PASS before and once it runs again. doctor reads the tasks from the service's sealed answer
    to a ping (real munged)."""
    munged, sock = start_munged(str(tmp_path), "munge")
    proc, port, log = serve(tmp_path, munge_socket=sock)
    folder = str(tmp_path)
    cfg = str(tmp_path / "gpueff.toml")

    def doctor_tasks() -> dict[str, str]:
        out = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", cfg, "doctor", "--role",
                              "service", "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
        lines = json.loads(out.stdout)["checks"]
        return next(ln for ln in lines if ln["check"] == "tasks")

    try:
        wait_runs(folder, 2)
        line = doctor_tasks()
        assert line["status"] == "PASS" and "on time: " in line["detail"], line
        assert "probe " in line["detail"] and "ingest " in line["detail"] and "s ago" in line["detail"], line
        (tmp_path / "block").touch()
        blocked = len(wait_runs(folder, len(taskprobe.runs(folder)) + 1))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            _status, body = health(port)
            probe = next(t for t in body["tasks"] if t["task"] == "probe")
            if late(probe):
                break
            time.sleep(0.2)
        assert probe["running"] and probe["late_s"] > 3 * probe["period_s"], probe
        line = doctor_tasks()
        assert line["status"] == "FAIL" and "probe late by" in line["detail"] and "running for" in line["detail"]
        assert "ingest" not in line["detail"]  # the other tasks are on time
        (tmp_path / "block").unlink()
        wait_runs(folder, blocked + 2)
        assert doctor_tasks()["status"] == "PASS"
    finally:
        out = stop(proc, log)
        munged.terminate()
        munged.wait(10)
    assert "Traceback" not in out


def test_lateness_of_interval_and_cron_tasks_and_what_doctor_says(tmp_path):
    """taskhealth's rules through the real API and doctor's check: an interval task never started since a
    service start 1000 s ago (interval 10 s) is 990 s late, FAIL naming it; a cron task is late from its previous
    cron time until it runs, but the monthly report is not FAILed before 3 months; a failed run is a WARN naming
    the task and its public reason."""
    from datetime import UTC, datetime

    from slurm_gpueff.cli import doctor
    from slurm_gpueff.service import api
    from slurm_gpueff.service.taskhealth import cron_times, report

    munged, sock = start_munged(str(tmp_path), "munge")
    cfg = Config({"paths": {"spool_dir": str(tmp_path / "spool"), "state_dir": str(tmp_path / "state"),
                            "database": str(tmp_path / "g.db")},
                  "service": {"api_listen": f"unix:{tmp_path}/api.sock", "munge_socket": sock}})
    ctx = tasks.Context(cfg, make_engine(cfg.paths.database))

    def broken(_c: tasks.Context) -> str:
        raise RuntimeError("a bug")

    lost = tasks.Task("lost", lambda _c: "ok", 10.0)
    monthly = tasks.Task("monthly", lambda _c: "ok", cron={"day": 1, "hour": 6})
    failing = tasks.Task("failing", broken, 60.0)
    ctx.schedule = [lost, monthly, failing]
    ctx.started_mono, ctx.started = time.monotonic() - 1000, time.time() - 40 * 86400
    tasks.run_task(ctx, failing)
    lines = {ln["task"]: ln for ln in report(ctx)["tasks"]}
    assert 989 < lines["lost"]["late_s"] < 1100 and late(lines["lost"]) and lines["lost"]["last_start"] is None
    prev, _next = cron_times(monthly.cron or {}, datetime.now(UTC))
    assert prev is not None and lines["monthly"]["late_s"] == pytest.approx(time.time() - prev.timestamp(), abs=5)
    assert 27 * 86400 < lines["monthly"]["period_s"] < 32 * 86400 and not late(lines["monthly"])
    assert lines["failing"]["ok"] is False and lines["failing"]["error"] == "RuntimeError"
    assert lines["failing"]["late_s"] == 0 and not lines["failing"]["running"]
    tasks.run_task(ctx, monthly)
    assert {ln["task"]: ln for ln in report(ctx)["tasks"]}["monthly"]["late_s"] == 0

    from prometheus_client import generate_latest

    from slurm_gpueff.service.metrics import registry_for

    scraped = generate_latest(registry_for(ctx.engine, cfg, ctx)).decode()
    assert 'gpueff_task_late_seconds{task="lost"} 9' in scraped and 'gpueff_task_late_seconds{task="failing"} 0.0' \
        in scraped and "gpueff_clock_steps_total 0.0" in scraped, scraped

    server = api.start(cfg, None, lambda: None, lambda: report(ctx))
    try:
        rep = doctor.Report()
        doctor.check_tasks(rep, cfg)
    finally:
        api.stop(server)
        munged.terminate()
        munged.wait(10)
    got = {ln["check"]: ln for ln in rep.lines}
    assert got["tasks"]["status"] == doctor.FAIL and got["tasks"]["detail"].startswith("lost late by 9"), got
    assert "monthly" not in got["tasks"]["detail"] and "failing" not in got["tasks"]["detail"]
    assert got["task errors"]["status"] == doctor.WARN and "failing's last run failed (RuntimeError)" in \
        got["task errors"]["detail"]
