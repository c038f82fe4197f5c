"""The idle-GPU policy: its decisions (analysis/idle.py, pure) and a pass of it (service/alerts.py) over a real
SQLite database with mail through a real SMTP server on loopback. ``squeue`` is replaced by a function here
only; tests/slurm/test_slurm_alerts.py runs the whole policy against real Slurm daemons."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from hooksite import make_record
from hypothesis import given
from hypothesis import strategies as st
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlmodel import Session, select

from slurm_gpueff.analysis import idle
from slurm_gpueff.config import AlertsConfig, Config
from slurm_gpueff.models import AlertLog, LiveSample
from slurm_gpueff.service.alerts import run_alerts
from slurm_gpueff.slurm.commands import SlurmJob, parse_squeue
from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.writer import ingest_record

T = datetime(2026, 11, 27, 12, 0, 0)
CFG = AlertsConfig(window_min=60.0, grace_min=30.0, warn_again_min=30.0, cancel_after_min=30.0)


def _samples(kernel: float, sm: float | None, minutes: int, every: int = 5) -> list[idle.Sample]:
    """Cumulative samples of a GPU at constant activity, one every ``every`` minutes up to T."""
    out = []
    for m in range(0, minutes + 1, every):
        cov = 60.0 * m
        out.append(idle.Sample(T - timedelta(minutes=minutes - m), cov, kernel * cov,
                               None if sm is None else sm * cov))
    return out


def _job(samples: dict[tuple[str, int], list[idle.Sample]], start_min: int = 180, **kw) -> idle.RunningJob:
    return idle.RunningJob("c", 5, 0, "alice", "proj", T - timedelta(minutes=start_min), T,
                           samples=samples, **kw)


def test_the_window_is_the_last_hour_not_the_whole_job():
    busy_then_idle = _samples(0.9, 0.5, 120)[:13]  # 60 min busy ...
    last = busy_then_idle[-1]
    for m in range(5, 65, 5):  # ... then 60 min idle
        busy_then_idle.append(idle.Sample(last.as_of + timedelta(minutes=m), last.covered_s + 60 * m,
                                          last.kernel_s, last.sm_s))
    w = idle.window(busy_then_idle, T - timedelta(minutes=180), 60, "n", 0)
    assert w.covered_s == 3600 and w.kernel == 0 and w.sm == 0
    d = idle.decide(_job({("n", 0): busy_then_idle}), [], CFG, busy_then_idle[-1].as_of)
    assert d.action == idle.WARN and "kernel 0.0 %, SM 0.00 %" in d.detail


def test_sm_activity_catches_what_kernel_activity_cannot_and_busy_gpus_are_left_alone():
    spin = {("n", 0): _samples(1.0, 0.0076, 90)}  # one SM spinning: kernel 100 %
    assert idle.decide(_job(spin), [], CFG, T).action is None, "kernel activity high: not idle by this rule"
    loaded = {("n", 0): _samples(0.97, 0.8, 90)}
    assert idle.decide(_job(loaded), [], CFG, T).action is None
    one_idle = {("n", 0): _samples(0.97, 0.8, 90), ("n", 1): _samples(0.0, 0.0, 90)}
    assert idle.decide(_job(one_idle), [], CFG, T).action is None, "a job is idle when all its GPUs are"
    no_gpm = {("n", 0): _samples(0.01, None, 90)}
    d = idle.decide(_job(no_gpm), [], CFG, T)
    assert d.action == idle.WARN and "judged on kernel activity" in d.detail


def test_too_little_measured_grace_stale_and_exempt_jobs_are_not_judged():
    idle_gpu = {("n", 0): _samples(0.0, 0.0, 90)}
    gap = [s for s in idle_gpu[("n", 0)] if not (T - timedelta(minutes=50) < s.as_of < T)]
    thin = [idle.Sample(s.as_of, s.covered_s if s.as_of < T else gap[-2].covered_s + 600, 0.0, 0.0) for s in gap]
    d = idle.decide(_job({("n", 0): thin}), [], CFG, T)
    assert d.action is None and "not measured enough" in d.detail
    assert "grace period" in idle.decide(_job(idle_gpu, start_min=20), [], CFG, T).detail
    assert "stale" in idle.decide(_job(idle_gpu), [], CFG, T + timedelta(minutes=21)).detail
    inter = idle.decide(_job(idle_gpu, interactive=True), [], CFG, T)
    assert inter.action == idle.EXEMPT and "interactive" in inter.detail
    assert idle.decide(_job(idle_gpu, interactive=True), [idle.Past(T, idle.EXEMPT)], CFG, T).action is None
    cfg = AlertsConfig(exempt_partitions=["debug"], exempt_users=["bob"])
    assert "partition debug" in idle.decide(_job(idle_gpu, partition="debug"), [], cfg, T).detail
    assert idle.decide(_job(idle_gpu, partition="gpu"), [], cfg, T).action == idle.WARN


def test_the_steps_warn_warn_again_then_cancel_only_when_enabled():
    g = {("n", 0): _samples(0.0, 0.0, 90)}
    j = _job(g)
    w1 = [idle.Past(T - timedelta(minutes=10), idle.WARN)]
    assert idle.decide(j, w1, CFG, T).action is None, "the second warning waits warn_again_min"
    w1 = [idle.Past(T - timedelta(minutes=31), idle.WARN)]
    assert idle.decide(j, w1, CFG, T).action == idle.WARN_AGAIN
    w2 = w1 + [idle.Past(T - timedelta(minutes=31), idle.WARN_AGAIN)]
    assert idle.decide(j, w2, CFG, T).action == idle.WOULD_CANCEL
    on = AlertsConfig(cancel=True)
    assert idle.decide(j, w2, on, T).action == idle.CANCEL
    noted = w2 + [idle.Past(T - timedelta(minutes=1), idle.WOULD_CANCEL)]
    assert idle.decide(j, noted, CFG, T).action is None, "would_cancel is noted once"
    assert idle.decide(j, noted, on, T).action == idle.CANCEL, "a site that turns cancel on later cancels"
    busy = _job({("n", 0): _samples(0.9, 0.6, 90)})
    assert idle.decide(busy, w2, CFG, T).action == idle.RECOVERED
    after = w2 + [idle.Past(T - timedelta(minutes=1), idle.RECOVERED)]
    assert idle.decide(j, after, CFG, T).action == idle.WARN, "idle again after recovering: from the start"


def test_parse_squeue_reads_batch_flag_partition_qos_and_run():
    text = ("101   1   gpu   normal   RUNNING   0\n102  0  debug  high  RUNNING 3\n103_4 1 gpu normal RUNNING 0\n"
            "104 1 gpu normal RUNNING\nbad\n")
    assert parse_squeue(text) == {101: SlurmJob("RUNNING", "gpu", "normal", False, 0),
                                  102: SlurmJob("RUNNING", "debug", "high", True, 3),
                                  104: SlurmJob("RUNNING", "gpu", "normal", False, None)}


def _db(tmp_path, jobs: dict[int, str]):
    """Live rows of jobs (id -> user) with constant figures, as ingest makes them."""
    engine = make_engine(str(tmp_path / "a.db"))
    start = T.timestamp() - 7200
    with Session(engine) as s:
        for job_id, user in jobs.items():
            rec = make_record(job_id, gpus=1, start=start, end=T.timestamp() - 6000, live=True, exit_code=None,
                              signal=None, user=user)
            rec["gpus"][0].update(kernel_active=0.0 if job_id % 2 else 0.9, sm_active=0.0 if job_id % 2 else 0.6)
            ingest_record(s, rec)
        s.commit()
    return engine


def _later_snapshot(engine, job_ids, end):
    with Session(engine) as s:
        for job_id in job_ids:
            rec = make_record(job_id, gpus=1, start=T.timestamp() - 7200, end=end, live=True, exit_code=None,
                              signal=None)
            rec["gpus"][0].update(kernel_active=0.0 if job_id % 2 else 0.9, sm_active=0.0 if job_id % 2 else 0.6)
            ingest_record(s, rec)
        s.commit()


@pytest.mark.smtp
def test_a_pass_mails_the_owner_audits_and_cancels_nothing_by_default(tmp_path, smtp_server):
    inbox, port = smtp_server
    cfg = Config({"site": {"cluster": "testc"}, "mail": {"host": "127.0.0.1", "port": port},
                  "reports": {"address_pattern": "{user}@cluster.example"},
                  "alerts": {"enabled": True, "window_min": 60, "cancel_after_min": 0, "warn_again_min": 1}})
    engine = _db(tmp_path, {11: "alice", 12: "bob"})  # 11 idle, 12 busy
    squeue = {11: SlurmJob("RUNNING", "gpu", "normal", False), 12: SlurmJob("RUNNING", "gpu", "normal", False)}
    cancelled: list[int] = []
    try:
        r = run_alerts(engine, cfg, now=T - timedelta(minutes=99), squeue=lambda ids: squeue)
        assert r.actions == [] and r.judged == 2, r  # 20 min after their start: within the grace period
        _later_snapshot(engine, [11, 12], T.timestamp())
        r = run_alerts(engine, cfg, now=T, squeue=lambda ids: squeue)
        assert [a.split(":")[1].strip().split(" ")[0] for a in r.actions] == ["warn"], r
        (rcpt, msg), = inbox.messages
        assert rcpt == ["alice@cluster.example"] and "job 11 has been idle for 60 minutes" in msg["Subject"]
        body = msg.get_body(("plain",)).get_content()
        assert "GPU 0 on node01: kernel 0.0 %, SM 0.00 %" in body and "scancel 11" in body
        assert "not cancelled automatically" in body
        for k in (2, 3):  # warn_again, then would_cancel: cancel is off
            r = run_alerts(engine, cfg, now=T + timedelta(minutes=k), squeue=lambda ids: squeue,
                           act=None if k == 2 else lambda a, j, s, d: cancelled.append(j.job_id) or "x")
        with Session(engine) as s:
            rows = s.exec(select(AlertLog).order_by(AlertLog.id)).all()
            assert [(x.job_id, x.action) for x in rows] == [(11, "warn"), (11, "warn_again"), (11, "would_cancel")]
            assert rows[0].outcome == "mailed alice@cluster.example" and not rows[0].dry_run
            assert len(s.exec(select(LiveSample)).all()) == 4
        assert cancelled == [] and len(inbox.messages) == 2
        # a dry run decides from its own audit and sends nothing
        r = run_alerts(engine, cfg, now=T + timedelta(minutes=4), squeue=lambda ids: squeue, dry_run=True)
        assert r.actions == ["job 11: warn (dry run) (mail to alice@cluster.example not sent (dry run))"], r
        assert len(inbox.messages) == 2
        # squeue says the job ended: nothing judged
        r = run_alerts(engine, cfg, now=T + timedelta(minutes=5), squeue=lambda ids: {})
        assert r.judged == 0 and r.actions == []
    finally:
        engine.dispose()


def _steps(r) -> list[str]:
    return [a.split(": ")[1].split(" ")[0] for a in r.actions if a.startswith("job ")]


@pytest.mark.smtp
def test_a_refused_address_is_backed_off_the_admins_told_once_and_the_owner_never_unwarned_cancelled(
        tmp_path, monkeypatch, refusing_smtp_server):
    """With cancel on, through a real SMTP server on loopback that refuses the owner's address with 550 (the
    admins' address it accepts): no warning reaches the owner, so nothing goes further than a warning; the
    address is tried after 1, 2, 4 intervals (held back in between, and the server sees no RCPT then), the
    admins are told once; three refused warnings spend none of the two mails a day allowed. Once the address
    takes mail, the next try is the first warning, then the second, then the cancel."""
    from slurm_gpueff.service import alerts

    handler, port = refusing_smtp_server
    handler.only = {"alice@cluster.example"}
    cancelled: list[int] = []
    monkeypatch.setattr(alerts, "cancel", lambda config, job: cancelled.append(job.job_id) or "cancelled")
    cfg = Config({"site": {"cluster": "testc"}, "mail": {"host": "127.0.0.1", "port": port, "retries": 1},
                  "reports": {"address_pattern": "{user}@cluster.example", "admins": ["hpc@cluster.example"],
                              "dir": str(tmp_path / "reports")},
                  "alerts": {"enabled": True, "interval_s": 60, "window_min": 60, "cancel": True,
                             "cancel_after_min": 0, "warn_again_min": 1, "max_mails_per_user_per_day": 2}})
    engine = _db(tmp_path, {11: "alice"})
    squeue = {11: SlurmJob("RUNNING", "gpu", "normal", False, 0)}
    try:
        run_alerts(engine, cfg, now=T - timedelta(minutes=99), squeue=lambda ids: squeue)  # the window's start
        _later_snapshot(engine, [11], T.timestamp())
        steps = []
        for k in range(4):  # passes 2 min apart: tries at T, T+2 (1 min on), T+4 (2 min on); T+6 waits 4 min
            r = run_alerts(engine, cfg, now=T + timedelta(minutes=2 * k), squeue=lambda ids: squeue)
            steps += _steps(r)
        assert steps == ["warn", "warn", "warn", "warn"], steps
        assert "held back (mail to alice@cluster.example refused permanently 3 times in a row; next try after " \
               "2026-11-27 12:08:00 UTC)" in r.actions[0], r
        assert handler.asked.count("alice@cluster.example") == 3  # the held-back pass did not ask the server
        assert cancelled == []
        admins = [m for rcpt, m in handler.messages if rcpt == ["hpc@cluster.example"]]
        assert len(admins) == 1 and "Idle-GPU warnings to alice@cluster.example are refused" in admins[0]["Subject"]
        assert "550 5.1.1 mailbox unavailable" in admins[0].get_body(("plain",)).get_content()
        with Session(engine) as s:
            rows = s.exec(select(AlertLog).order_by(AlertLog.id)).all()
        assert [x.action for x in rows] == ["warn"] * 3
        assert all(x.outcome.startswith("mail to alice@cluster.example refused permanently: recipients refused")
                   for x in rows), rows[0].outcome
        handler.accept = True
        steps = []
        for k in range(4, 8):  # T+8: the wait is over, and the warning goes (three refused ones spent nothing)
            r = run_alerts(engine, cfg, now=T + timedelta(minutes=2 * k), squeue=lambda ids: squeue)
            steps += _steps(r)
        assert steps == ["warn", "warn_again", "cancel"], steps
        assert cancelled == [11]
        owner = [m["Subject"] for rcpt, m in handler.messages if rcpt == ["alice@cluster.example"]]
        assert len(owner) == 3 and "Warning" in owner[0] and "Cancelled" in owner[2], owner
        assert len([m for rcpt, m in handler.messages if rcpt == ["hpc@cluster.example"]]) == 1  # told once
    finally:
        engine.dispose()


@pytest.mark.smtp
def test_a_mail_outage_retries_every_pass_and_spends_no_allowance(tmp_path, refusing_smtp_server):
    """A temporary refusal (451, as a mail server that is down or full answers) is tried again at every pass,
    with no backoff and no admin notice; ten failed warnings against an allowance of two mails a day leave the
    allowance whole, so the pass after mail works again warns at once (before: rate_limited for a day)."""
    handler, port = refusing_smtp_server
    handler.reply = "451 4.3.0 mail system busy, try again later"
    cfg = Config({"site": {"cluster": "testc"}, "mail": {"host": "127.0.0.1", "port": port, "retries": 1},
                  "reports": {"address_pattern": "{user}@cluster.example", "admins": ["hpc@cluster.example"],
                              "dir": str(tmp_path / "reports")},
                  "alerts": {"enabled": True, "window_min": 60, "warn_again_min": 30,
                             "max_mails_per_user_per_day": 2}})
    engine = _db(tmp_path, {11: "alice"})
    squeue = {11: SlurmJob("RUNNING", "gpu", "normal", False, 0)}
    try:
        run_alerts(engine, cfg, now=T - timedelta(minutes=99), squeue=lambda ids: squeue)
        _later_snapshot(engine, [11], T.timestamp())
        for k in range(10):
            r = run_alerts(engine, cfg, now=T + timedelta(minutes=k), squeue=lambda ids: squeue)
            assert len(r.actions) == 1 and "(mail to alice@cluster.example failed: " in r.actions[0], r
        assert handler.messages == [] and len(handler.asked) == 10
        handler.accept = True
        r = run_alerts(engine, cfg, now=T + timedelta(minutes=10), squeue=lambda ids: squeue)
        assert r.actions == ["job 11: warn (mailed alice@cluster.example)"], r
        (rcpt, msg), = handler.messages
        assert rcpt == ["alice@cluster.example"] and "Warning" in msg["Subject"]
    finally:
        engine.dispose()


def test_a_run_that_slurm_no_longer_runs_is_not_judged(tmp_path):
    """A requeued job runs again under the same id: squeue's restart count says which run Slurm runs, and the
    live row of the run that ended (its node failed) is not judged on the new run's account."""
    cfg = Config({"site": {"cluster": "testc"}, "alerts": {"enabled": True, "window_min": 60}})
    engine = _db(tmp_path, {11: "alice"})
    try:
        run_alerts(engine, cfg, now=T - timedelta(minutes=99), squeue=lambda ids: {}, dry_run=True)  # samples
        _later_snapshot(engine, [11], T.timestamp())
        r = run_alerts(engine, cfg, now=T, squeue=lambda ids: {11: SlurmJob("RUNNING", "gpu", "normal", False, 1)},
                       dry_run=True)
        assert r.judged == 0 and r.actions == [], r
        r = run_alerts(engine, cfg, now=T, squeue=lambda ids: {11: SlurmJob("RUNNING", "gpu", "normal", False, 0)},
                       dry_run=True)
        assert r.judged == 1 and _steps(r) == ["warn"], r
    finally:
        engine.dispose()


def test_the_measured_window_is_said_as_it_was():
    w = idle.GpuWindow("n1", 0, 30.0, 0.0, 0.0)
    assert w.describe().endswith("over 30 s measured")
    assert idle.GpuWindow("n1", 0, 3600.0, 0.0, 0.0).describe().endswith("over 60.0 min measured")


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_pass_reads_the_running_jobs_by_their_index_not_the_whole_history(tmp_path, request, backend):
    """Every query of the pass that asks for the running jobs (their rows, their samples dropped and read, their
    GPU rows, their audit), as it ran (captured from the engine), is planned on the partial index ix_job_live on both
    backends beside a history of finished jobs: the pass grows with what runs, not with the years kept. On
    PostgreSQL the plan asked for is the generic one, which a prepared statement gets once psycopg has prepared
    it (after five runs in the long-running service): a predicate sent as a bound parameter does not match the
    index's there, and the test fails (SQLite plans with the bound values)."""
    from psycopg import sql
    from sqlalchemy import event, insert, text

    from slurm_gpueff.models import Job

    url = str(tmp_path / "a.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    if backend == "postgres":
        migrate.upgrade(make_engine(url, create=False))  # gpueff db upgrade
    engine = make_engine(url)
    try:
        with engine.begin() as c:  # a history: finished rows (hook records) around a few running ones
            c.execute(insert(Job), [{"cluster": "testc", "job_id": 1000 + i, "user": f"u{i % 50}",
                                     "record_source": "hook", "gpu_count": 1} for i in range(5000)])
            c.execute(text("ANALYZE"))
        seen: list[tuple[str, object]] = []

        def capture(_conn, _cursor, statement, parameters, _context, _many):
            if "record_source" in re.split(r"\sFROM\s", statement, maxsplit=1)[-1]:  # asked for, not just read
                seen.append((statement, parameters))

        _later_snapshot(engine, [11, 12], T.timestamp())  # two running jobs
        event.listen(engine, "before_cursor_execute", capture)
        cfg = Config({"site": {"cluster": "testc"}, "alerts": {"enabled": True}})
        r = run_alerts(engine, cfg, now=T, squeue=lambda ids: {}, dry_run=True)
        event.remove(engine, "before_cursor_execute", capture)
        # the rows; the samples dropped, read; the GPU rows; the audit's past steps of the running jobs
        assert r.judged == 0 and len(seen) == 5, seen
        with engine.connect() as c:
            for k, (statement, params) in enumerate(seen):
                if backend == "sqlite":
                    plan = " ".join(str(row[-1]) for row in c.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}",
                                                                               params))
                else:
                    names = re.findall(r"%\((\w+)\)s", statement)
                    prepared = re.sub(r"%\((\w+)\)s", lambda m, n=names: f"${n.index(m.group(1)) + 1}", statement)
                    c.exec_driver_sql(f"PREPARE q{k} AS {prepared}".replace("%%", "%"))
                    c.exec_driver_sql("SET plan_cache_mode = force_generic_plan")
                    raw = c.connection.driver_connection
                    args = f"({', '.join(sql.Literal(params[n]).as_string(raw) for n in names)})" if names else ""
                    plan = " ".join(row[0] for row in c.exec_driver_sql(f"EXPLAIN EXECUTE q{k}{args}"))
                assert "ix_job_live" in plan, (statement, plan)
    finally:
        engine.dispose()


def test_a_long_job_keeps_one_window_of_samples_and_is_judged_as_with_all(tmp_path):
    """Eight hours of live records, one every five minutes and a pass after each: the job's GPU keeps the
    samples of one window (and the one before it that the window starts from), not the 96 of its life, and
    the pass decides as it would from every sample (the job went idle in its last 70 minutes)."""
    cfg = Config({"site": {"cluster": "testc"}, "alerts": {"enabled": True, "window_min": 60, "grace_min": 0}})
    engine = make_engine(str(tmp_path / "a.db"))
    start = T - timedelta(hours=8)
    kernel_s = 0.0
    counts, warned = [], []
    try:
        for k in range(1, 97):
            at = start + timedelta(minutes=5 * k)
            busy = at <= T - timedelta(minutes=70)
            kernel_s += 300 * (0.9 if busy else 0.0)
            with Session(engine) as s:
                rec = make_record(11, gpus=1, start=start.timestamp(), end=at.timestamp(), live=True,
                                  exit_code=None, signal=None, user="alice")
                rec["gpus"][0].update(kernel_active=kernel_s / (300 * k), sm_active=kernel_s / (300 * k) * 0.5,
                                      measured_s=300.0 * k, window_s=300.0 * k)
                ingest_record(s, rec)
                s.commit()
            r = run_alerts(engine, cfg, now=at, squeue=lambda ids: {11: SlurmJob("RUNNING", "gpu", "normal", False)},
                           dry_run=True)
            warned += [at] if _steps(r) == ["warn"] else []
            with Session(engine) as s:
                counts.append(len(s.exec(select(LiveSample)).all()))
        assert max(counts) <= 60 // 5 + 2, counts  # one window's samples and its base, for the whole 8 hours
        assert counts[-1] == 13, counts
        assert warned == [T - timedelta(minutes=10)], warned  # the first pass whose last hour was all idle
    finally:
        engine.dispose()


@given(st.lists(st.tuples(st.integers(0, 24 * 60), st.floats(0, 1)), min_size=1, max_size=40, unique_by=lambda x: x[0]),
       st.sampled_from([5.0, 30.0, 60.0, 240.0]), st.integers(0, 24 * 60))
def test_the_samples_a_pass_keeps_give_the_window_of_all_of_them(points, window_min, started):
    """A pass keeps in memory, of each GPU's samples, only those its window reads (service.alerts.kept: the
    oldest, the window's base, the newest): the window over them equals the window over every sample, for
    any times, any activity, any window and any job start."""
    from slurm_gpueff.service.alerts import kept

    t0 = datetime(2027, 1, 1)
    covered = kernel = 0.0
    samples = []
    for minute, busy in sorted(points):
        covered, kernel = covered + 300.0, kernel + 300.0 * busy
        samples.append(idle.Sample(t0 + timedelta(minutes=minute), covered, kernel, kernel / 2))
    start = t0 + timedelta(minutes=started) - timedelta(days=1)
    base = idle.window_base(samples, window_min)
    few = kept(samples, base)
    assert len(few) <= 3
    assert idle.window(few, start, window_min, "n", 0) == idle.window(samples, start, window_min, "n", 0)
