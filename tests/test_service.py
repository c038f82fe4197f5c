"""`gpueff serve`: scheduled tasks, /metrics parsed back with prometheus_client, SIGTERM, retention."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import synthetic
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from slurm_gpueff import spool
from slurm_gpueff.config import Config, read_secret
from slurm_gpueff.errors import GpueffError
from slurm_gpueff.models import Job, JobGpuTimeline
from slurm_gpueff.service import tasks
from slurm_gpueff.service.metrics import registry_for
from slurm_gpueff.service.metrics import serve as metrics_serve
from slurm_gpueff.service.scheduler import build_scheduler
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.rollups import refresh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.process  # its tests start real processes (CLI commands, hooks, services)


def config(tmp_path, **service) -> Config:
    return Config({"paths": {"spool_dir": str(tmp_path / "spool"), "state_dir": str(tmp_path / "state"),
                             "database": str(tmp_path / "g.db")}, "service": service})


@pytest.fixture
def loaded(tmp_path):
    cfg = config(tmp_path, metrics_top_users=3, metrics_top_accounts=100, metrics_per_user=True)
    for i in range(60):
        spool.write_record(cfg.paths.spool_dir, synthetic.record(i + 1, gpus=2, timeline_points=3,
                                                                 end=1.70e9 + i * 3600))
    engine = make_engine(cfg.paths.database)
    assert ingest_spool(engine, cfg.paths.spool_dir).ingested == 60
    assert summarize_pending(engine, cfg.analysis) == 60
    refresh(engine, full=True)
    return cfg, engine


def families(engine, cfg) -> dict:
    text = generate_latest(registry_for(engine, cfg)).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metrics_parse_and_equal_the_database(loaded):
    cfg, engine = loaded
    fams = families(engine, cfg)
    with engine.connect() as conn:
        by_account = dict(conn.execute(select(Job.account, func.sum(Job.gpu_hours)).group_by(Job.account)).all())
        verdicts = dict(conn.execute(select(Job.verdict, func.count()).group_by(Job.verdict)).all())
        users = conn.execute(select(func.count(func.distinct(Job.user)))).scalar()
    alloc = {s.labels["account"]: s.value for s in fams["gpueff_gpu_hours_allocated"].samples
             if s.name.endswith("_total")}
    assert alloc.keys() == by_account.keys()
    for account, v in by_account.items():
        assert alloc[account] == pytest.approx(v)
    jobs = {}
    for s in fams["gpueff_jobs"].samples:
        if s.name.endswith("_total"):
            jobs[s.labels["verdict"]] = jobs.get(s.labels["verdict"], 0) + s.value
    assert jobs == {(k or "none"): v for k, v in verdicts.items()}
    # Users are capped: the top 3 by GPU-hours plus "other", and nothing is lost by the folding.
    assert users > 3
    u = {s.labels["user"]: s.value for s in fams["gpueff_user_gpu_hours_allocated"].samples
         if s.name.endswith("_total")}
    assert len(u) == 4 and "other" in u
    assert sum(u.values()) == pytest.approx(sum(by_account.values()))
    # No per-job labels anywhere.
    for f in fams.values():
        for s in f.samples:
            assert not {"job", "job_id", "jobid"} & set(s.labels)
    waste = {s.labels["account"]: s.value for s in fams["gpueff_gpu_hours_wasted"].samples}
    assert all(v >= 0 for v in waste.values()) and waste
    assert fams["gpueff_database_up"].samples[0].value == 1


def test_no_per_user_series_unless_the_site_asks(loaded):
    """A user's GPU-hours and waste are theirs: by default /metrics has accounts only."""
    cfg, engine = loaded
    default = config(Path(cfg.paths.spool_dir).parent, metrics_top_accounts=100)
    assert not default.service.metrics_per_user
    fams = families(engine, default)
    assert fams["gpueff_gpu_hours_allocated"].samples and fams["gpueff_jobs"].samples
    assert not [name for name in fams if name.startswith("gpueff_user_")]
    assert all("user" not in s.labels for f in fams.values() for s in f.samples)
    assert [name for name in families(engine, cfg) if name.startswith("gpueff_user_")]  # the site asked


def test_metrics_answer_only_the_bearer_token_when_one_is_set(loaded, tmp_path):
    """[service] metrics_token_file: a scrape without the token, or with another, gets 401 and no figure;
    Prometheus' authorization header gets the figures. A token file every user may read is refused."""
    cfg, engine = loaded
    token = tmp_path / "metrics.token"
    token.write_text("s3cret-token\n")
    token.chmod(0o600)
    server, _thread = metrics_serve(registry_for(engine, cfg), "127.0.0.1", 0, read_secret(
        str(token), "service.metrics_token_file", "the token"))
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret-token"}):
            with pytest.raises(urllib.error.HTTPError) as denied:
                urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10)
            assert denied.value.code == 401 and b"gpueff_" not in denied.value.read()
        ok = urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": "Bearer s3cret-token"}),
                                    timeout=10).read().decode()
        assert "gpueff_gpu_hours_allocated_total" in ok
    finally:
        server.shutdown()
        server.server_close()
    token.chmod(0o644)
    with pytest.raises(GpueffError, match="readable by every user"):
        read_secret(str(token), "service.metrics_token_file", "the token")


def test_retention_drops_old_timelines_only(loaded):
    cfg, engine = loaded
    cut = datetime.fromtimestamp(1.70e9 + 30 * 3600, UTC).replace(tzinfo=None)
    with engine.connect() as conn:
        before = conn.execute(select(func.count()).select_from(JobGpuTimeline)).scalar()
    gone = tasks.prune_timelines(engine, cut, batch=7)
    with engine.connect() as conn:
        after = conn.execute(select(func.count()).select_from(JobGpuTimeline)).scalar()
        jobs = conn.execute(select(func.count()).select_from(Job).where(Job.gpu_hours.is_not(None))).scalar()
    assert gone == before - after and 0 < gone < before
    assert jobs == 60  # figures and summaries stay
    assert tasks.prune_timelines(engine, cut) == 0


def test_scheduler_never_overlaps_and_coalesces(tmp_path):
    cfg = config(tmp_path, misfire_grace_s=120)
    ctx = tasks.Context(cfg, make_engine(cfg.paths.database))
    sched = build_scheduler(ctx, tasks.builtin_tasks(cfg))
    sched.start(paused=True)  # job defaults are applied when the scheduler starts
    jobs = sched.get_jobs()
    sched.shutdown(wait=False)
    names = [j.id for j in jobs]
    assert {"ingest", "enrich", "rollups", "rollups_full", "retention", "report_cards", "report_monthly"} <= set(names)
    assert len(names) == len(set(names)) == len(tasks.builtin_tasks(cfg))  # one job per task, the catch-up its own
    soon = datetime.now(UTC) + timedelta(seconds=60)
    first = {j.id: j.next_run_time for j in jobs}
    assert first["ingest"] < soon and first["report_monthly"] < soon  # caught up once after a restart
    assert first["database_check"] > soon  # it ran before the scheduler started
    for j in jobs:
        assert j.max_instances == 1 and j.coalesce is True and j.misfire_grace_time == 120


def test_a_failing_task_is_logged_and_the_service_goes_on(tmp_path, caplog):
    cfg = config(tmp_path)
    ctx = tasks.Context(cfg, make_engine(cfg.paths.database))

    def boom(_ctx):  # noqa: ANN001
        raise RuntimeError("broken")

    tasks.run_task(ctx, tasks.Task("boom", boom, 60))
    assert "boom" in ctx.last_error and "boom" not in ctx.last_ok and "broken" in caplog.text
    tasks.run_task(ctx, tasks.Task("ingest", tasks.ingest, 60))
    assert "ingest" in ctx.last_ok


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_until_ingested(tmp_path, n: int, service: str = "", env: dict[str, str] | None = None) -> str:  # noqa: ANN001
    """Run `gpueff serve` on a spool of ``n`` records until /metrics counts them all; SIGTERM; its output."""
    port = _free_port()
    cfg_path = tmp_path / "gpueff.toml"
    cfg_path.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
                        f'database = "{tmp_path}/g.db"\n[service]\nmetrics_port = {port}\nenrich_interval_s = 0\n'
                        + service)
    for i in range(n):
        spool.write_record(str(tmp_path / "spool"), synthetic.record(i + 1, gpus=1, timeline_points=2))
    p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg_path), "serve"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, **(env or {})})
    try:
        body, deadline = "", time.time() + 90
        while time.time() < deadline:
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            except OSError:
                body = ""
            rolled = 'gpueff_task_last_success_timestamp_seconds{task="rollups"}' in body
            if rolled and "gpueff_gpu_hours_allocated_total" in body:
                break
            time.sleep(0.3)
        fams = {f.name: f for f in text_string_to_metric_families(body)}
        assert sum(s.value for s in fams["gpueff_jobs"].samples if s.name.endswith("_total")) == n
        assert not os.listdir(tmp_path / "spool" / "incoming")
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert "SIGTERM" in out and "stopped" in out
    return out


def test_serve_ingests_serves_metrics_and_stops_on_sigterm(tmp_path):
    out = serve_until_ingested(tmp_path, 5)
    assert "ingested 5, quarantined 0, failed 0" in out


def test_serve_logs_a_quarantined_record_once(tmp_path):
    """A record ingest refuses was logged twice by `gpueff serve`: by ingest as it moved the file, and again
    by the ingest task with the run's errors. Once now, with where it went."""
    spool.ensure_dirs(str(tmp_path / "spool"))
    spool.atomic_write(str(tmp_path / "spool" / "incoming" / "job-77-n1.json"), b'{"schema": 1, "cluster": ')
    out = serve_until_ingested(tmp_path, 2)
    assert "ingested 2, quarantined 1, failed 0" in out
    lines = [line for line in out.splitlines() if "job-77-n1.json" in line]
    assert len(lines) == 1, lines
    assert " WARNING ingest: job-77-n1.json: " in lines[0] and "not valid JSON" in lines[0]
    assert f"(quarantined as {tmp_path}/spool/quarantine/job-77-n1.json)" in lines[0]


def test_serve_says_its_schema_in_one_line(tmp_path):
    """`gpueff serve` logged Alembic's INFO chatter at start (plugins, "Context impl", "Will assume
    non-transactional DDL", each migration: 30 lines on a new database). It says one line: the schema's
    revision and what was migrated, here a new database, then the same database again."""
    from slurm_gpueff.storage import migrate

    cfg_path = tmp_path / "gpueff.toml"
    cfg_path.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
                        f'database = "{tmp_path}/g.db"\n[service]\nmetrics_port = 0\nenrich_interval_s = 0\n')

    def start_lines() -> list[str]:  # what serve logs up to its first scheduled task's line
        p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg_path), "serve"],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []
        try:
            assert p.stdout is not None
            for line in p.stdout:
                lines.append(line)
                if " task ingest: every " in line:
                    break
        finally:
            p.send_signal(signal.SIGTERM)
            rest, _ = p.communicate(timeout=30)
        assert p.returncode == 0, "".join(lines) + rest
        return lines

    head = migrate.head()
    for want in (f"database schema: revision {head}, made new ({int(head)} migrations: 0001 to {head})",
                 f"database schema: revision {head}, nothing to migrate"):
        lines = start_lines()
        schema = [line for line in lines if "schema" in line]
        assert len(schema) == 1 and schema[0].rstrip().endswith(f" INFO {want}"), lines
        for chatter in ("alembic", "Context impl", "non-transactional DDL", "Running upgrade"):
            assert not any(chatter in line for line in lines), (chatter, lines)
        assert len(lines) <= 12, lines  # the schema, the database check, a line a task


def test_serve_drains_a_backlog_in_one_process(tmp_path):
    """A backlog of 500 records is drained by the scheduler thread, and the service still stops cleanly on
    SIGTERM."""
    out = serve_until_ingested(tmp_path, 500)
    assert "ingested 500, quarantined 0, failed 0" in out


def test_doctor_warns_when_every_users_figures_are_open(tmp_path):
    """doctor: per-user series without a token are a warning naming the fix; a token file it cannot use
    fails; the default (no per-user series) adds no line."""
    from slurm_gpueff.cli import doctor

    def doctor_lines(cfg: Config) -> list[tuple[str, str]]:
        rep = doctor.Report()
        doctor.check_metrics(rep, cfg)
        return [(line["status"], line["detail"]) for line in rep.lines]

    assert doctor_lines(config(tmp_path)) == []
    open_ = doctor_lines(config(tmp_path, metrics_per_user=True))
    assert [s for s, _ in open_] == [doctor.WARN] and "metrics_token_file" in open_[0][1]
    token = tmp_path / "t"
    token.write_text("Zq9-metrics-secret\n")
    token.chmod(0o644)
    bad = doctor_lines(config(tmp_path, metrics_per_user=True, metrics_token_file=str(token)))
    assert [s for s, _ in bad] == [doctor.FAIL] and "readable by every user" in bad[0][1]
    token.chmod(0o600)
    good = doctor_lines(config(tmp_path, metrics_per_user=True, metrics_token_file=str(token)))
    assert [s for s, _ in good] == [doctor.PASS] and "Zq9-metrics-secret" not in good[0][1]


def test_sigterm_stops_enrich_at_its_next_sacct_call(tmp_path):
    """A stopping service waits for its running tasks; enrich through a large backlog is many sacct calls
    (one per ``[sacct] batch_size`` jobs), and the stop waited for all of them. It now ends at its next
    batch. Real `gpueff serve`, the sacct stand-in (tests/fake_slurm_cmd.py) a real program taking 2 s a
    call: 8 jobs in batches of 1; SIGTERM once the first call has begun; the calls made, counted from the
    stand-in's own log, are that one and at most one more, not the 8."""
    from test_seff_rawid import install_fake

    install_fake(str(tmp_path / "bin"), "sacct")
    calls = tmp_path / "slurm.log"
    cfg_path = tmp_path / "gpueff.toml"
    cfg_path.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
                        f'database = "{tmp_path}/g.db"\n[service]\nmetrics_port = 0\nenrich_interval_s = 1\n'
                        f'[sacct]\ncommand = "{tmp_path}/bin/sacct"\nformat = "parsable"\nbatch_size = 1\n'
                        'settle_s = 0\n')
    for i in range(8):
        spool.write_record(str(tmp_path / "spool"), synthetic.record(9000 + i, gpus=1, timeline_points=2,
                                                                     end=time.time() - 3600))
    p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg_path), "serve"],
                         cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "FAKE_SLURM_LOG": str(calls), "FAKE_SLURM_SLEEP_S": "2",
                              "FAKE_SLURM_DATA": os.path.join(ROOT, "tests", "data", "slurmcmds")})

    def sacct_calls() -> int:
        return sum('"-j"' in line for line in calls.read_text().splitlines()) if calls.exists() else 0

    try:
        deadline = time.time() + 60
        while sacct_calls() < 1 and time.time() < deadline and p.poll() is None:
            time.sleep(0.1)
        assert sacct_calls() == 1
    finally:
        p.send_signal(signal.SIGTERM)
        out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    assert sacct_calls() <= 2, out
    assert "stopped there: the service is stopping (the next run continues)" in out, out
