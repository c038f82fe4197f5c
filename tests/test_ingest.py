"""Ingest from a real spool into a real SQLite database: idempotent, merging, quarantining, patient."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from datetime import UTC, datetime

import pytest
from hooksite import HookSite, make_record
from sqlalchemy import event
from sqlmodel import Session, SQLModel, create_engine, select

from slurm_gpueff import spool
from slurm_gpueff.models import Job, JobGpu, JobGpuTimeline
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool


@pytest.fixture
def db(tmp_path):
    return make_engine(str(tmp_path / "gpueff.db"))


@pytest.fixture
def spool_dir(tmp_path) -> str:
    return str(tmp_path / "spool")


def snapshot(engine) -> dict[str, list[tuple]]:
    """Every row of every table, as plain tuples (primary keys included)."""
    out = {}
    with Session(engine) as s:
        for model in (Job, JobGpu, JobGpuTimeline):
            cols = list(model.__table__.columns.keys())
            rows = s.exec(select(model)).all()
            out[model.__tablename__] = sorted(tuple(json.dumps(getattr(r, c), default=str) for c in cols)
                                              for r in rows)
    return out


def the_job(engine, job_id: int, cluster: str = "testc") -> tuple[Job, list[JobGpu]]:
    with Session(engine) as s:
        job = s.exec(select(Job).where(Job.cluster == cluster, Job.job_id == job_id)).one()
        stmt = select(JobGpu).where(JobGpu.job_pk == job.id).order_by(JobGpu.node, JobGpu.gpu_index)
        gpus = s.exec(stmt).all()
        return job, list(gpus)


def test_ingest_stores_job_gpus_and_timelines_then_empties_the_spool(db, spool_dir):
    spool.write_record(spool_dir, make_record(10, exit_code=0))
    res = ingest_spool(db, spool_dir)
    assert (res.ingested, res.quarantined, res.failed, res.errors) == (1, 0, 0, [])
    assert list(spool.pending(spool_dir)) == []
    job, gpus = the_job(db, 10)
    assert (job.user, job.uid, job.account, job.partition) == ("alice", 1000, "proj", "gpu")
    assert job.gpu_count == 2 and job.nodelist == "node01" and job.backend == "simulated"
    assert job.state == "COMPLETED" and job.elapsed_s == 3600.0 and job.gpu_type == "Sim H100"
    assert job.start_time == datetime(2023, 11, 14, 22, 13, 20)  # naive UTC
    assert [g.gpu_index for g in gpus] == [0, 1] and gpus[1].sm_active == pytest.approx(0.51)
    assert gpus[0].missing == {} and gpus[0].memory_used_peak_bytes == 2**30
    with Session(db) as s:
        tls = s.exec(select(JobGpuTimeline)).all()
        assert len(tls) == 2 and tls[0].points == [[30.0, 0.9, 0.5, 0.3], [90.0, 0.8, 0.4, 0.2]]


def test_ingest_is_idempotent_when_the_same_record_comes_again(db, spool_dir, tmp_path):
    """A crash between commit and unlink re-spools a record: the rows must come out identical."""
    spool.write_record(spool_dir, make_record(11))
    spool.write_record(spool_dir, make_record(11, node="node02"))
    saved = str(tmp_path / "copy")
    shutil.copytree(os.path.join(spool_dir, "incoming"), saved)
    assert ingest_spool(db, spool_dir).ingested == 2
    first = snapshot(db)
    for name in os.listdir(saved):
        shutil.copy(os.path.join(saved, name), os.path.join(spool_dir, "incoming", name))
    assert ingest_spool(db, spool_dir).ingested == 2
    assert snapshot(db) == first
    assert ingest_spool(db, spool_dir).ingested == 0 and snapshot(db) == first


@pytest.mark.parametrize("order", [("a", "b"), ("b", "a")])
def test_multi_node_job_merges_in_any_order(db, spool_dir, order):
    recs = {"a": make_record(12, node="gpu-a", gpus=2, start=1.7e9, end=1.7e9 + 100, exit_code=0,
                             reason="agent stale on gpu-a"),
            "b": make_record(12, node="gpu-b", gpus=1, start=1.7e9 - 5, end=1.7e9 + 90, exit_code=2,
                             backend="none", reason="no GPU collector")}
    recs["b"]["gpus"][0]["source"] = "none"
    for key in order:
        spool.write_record(spool_dir, recs[key])
        assert ingest_spool(db, spool_dir).ingested == 1
    job, gpus = the_job(db, 12)
    assert job.nodelist == "gpu-a,gpu-b" and job.gpu_count == 3 == len(gpus)
    assert job.start_time == datetime.fromtimestamp(1.7e9 - 5, UTC).replace(tzinfo=None)
    assert job.end_time == datetime.fromtimestamp(1.7e9 + 100, UTC).replace(tzinfo=None)
    assert job.elapsed_s == 105 and job.exit_code == 2 and job.state == "FAILED"
    assert job.backend == "simulated"  # the most capable backend that measured any GPU
    assert job.reason == "agent stale on gpu-a; no GPU collector"
    assert [(g.node, g.gpu_index) for g in gpus] == [("gpu-a", 0), ("gpu-a", 1), ("gpu-b", 0)]


def test_a_node_reporting_fewer_gpus_replaces_its_rows(db, spool_dir):
    spool.write_record(spool_dir, make_record(13, gpus=3))
    ingest_spool(db, spool_dir)
    spool.write_record(spool_dir, make_record(13, gpus=1))
    ingest_spool(db, spool_dir)
    job, gpus = the_job(db, 13)
    assert job.gpu_count == 1 and [g.gpu_index for g in gpus] == [0]
    with Session(db) as s:
        assert len(s.exec(select(JobGpuTimeline)).all()) == 1


@pytest.mark.parametrize("exit_code, signal, state", [(0, 0, "COMPLETED"), (3, 0, "FAILED"), (0, 9, None),
                                                      (None, None, None)])
def test_state_from_exit_code_and_signal(db, spool_dir, exit_code, signal, state):
    spool.write_record(spool_dir, make_record(14, exit_code=exit_code, signal=signal))
    ingest_spool(db, spool_dir)
    assert the_job(db, 14)[0].state == state


def test_unknown_start_time_is_stored_as_unknown(db, spool_dir):
    spool.write_record(spool_dir, make_record(15, start=None, reason="no Prolog state"))
    assert ingest_spool(db, spool_dir).ingested == 1
    job, gpus = the_job(db, 15)
    assert job.start_time is None and job.elapsed_s is None and gpus[0].start_time is None
    assert job.reason == "no Prolog state"


def test_malformed_files_are_quarantined_and_good_ones_ingested(db, spool_dir):
    spool.write_record(spool_dir, make_record(20))
    inc = os.path.join(spool_dir, "incoming")
    bad = {
        "job-1-empty.json": b"",
        "job-2-json.json": b'{"schema": 1, "cluster": ',
        "job-3-schema.json": json.dumps({**make_record(3), "schema": 99}).encode(),
        "job-4-value.json": json.dumps(make_record(4, gpus=1) | {"gpus": [
            {**make_record(4, gpus=1)["gpus"][0], "sm_active": 1.5}]}).encode(),
        "job-5-list.json": b"[1, 2]",
        "job-6-binary.json": b"\xff\xfe\x00garbage",
    }
    for name, data in bad.items():
        with open(os.path.join(inc, name), "wb") as fh:
            fh.write(data)
    spool.write_record(spool_dir, make_record(21))
    res = ingest_spool(db, spool_dir)
    assert (res.ingested, res.quarantined, res.failed) == (2, 6, 0)
    assert list(spool.pending(spool_dir)) == []
    q = os.path.join(spool_dir, "quarantine")
    errors = {}
    for name in bad:
        with open(os.path.join(q, name), "rb") as fh:
            assert fh.read() == bad[name], "quarantine keeps the file byte for byte"
        with open(os.path.join(q, name + ".error")) as fh:
            errors[name] = fh.read()
    assert "empty file" in errors["job-1-empty.json"]
    assert "not valid JSON" in errors["job-2-json.json"] and "not valid JSON" in errors["job-6-binary.json"]
    assert "unsupported schema 99" in errors["job-3-schema.json"]
    assert "sm_active must be a fraction" in errors["job-4-value.json"]
    assert "expected a JSON object" in errors["job-5-list.json"]
    assert the_job(db, 20)[0].gpu_count == 2 and the_job(db, 21)[0].gpu_count == 2


def _short_timeout_engine(path: str):
    """The same database, with a 0.2 s busy timeout so that a lock shows at once."""
    engine = create_engine(f"sqlite:///{path}", connect_args={"timeout": 0.2})

    @event.listens_for(engine, "connect")
    def _wal(conn, _rec):  # type: ignore[no-untyped-def]
        conn.execute("PRAGMA journal_mode=WAL")

    SQLModel.metadata.create_all(engine)
    return engine


def test_locked_database_keeps_the_files_for_the_next_run(tmp_path, spool_dir):
    path = str(tmp_path / "locked.db")
    engine = _short_timeout_engine(path)
    for j in range(30, 35):
        spool.write_record(spool_dir, make_record(j))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        res = ingest_spool(engine, spool_dir)
        assert (res.ingested, res.quarantined, res.failed) == (0, 0, 5)
        assert "database unavailable" in res.errors[0] and "locked" in res.errors[0]
        assert len(list(spool.pending(spool_dir))) == 5
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    res = ingest_spool(engine, spool_dir)
    assert (res.ingested, res.failed) == (5, 0) and list(spool.pending(spool_dir)) == []
    with Session(engine) as s:
        assert sorted(j.job_id for j in s.exec(select(Job)).all()) == [30, 31, 32, 33, 34]


def test_database_down_keeps_the_files(tmp_path, spool_dir):
    """A database path that cannot be opened (its parent is a regular file) is an outage, not bad data."""
    spool.write_record(spool_dir, make_record(40))
    blocker = tmp_path / "file"
    blocker.write_text("x")
    engine = create_engine(f"sqlite:///{blocker}/gpueff.db")
    res = ingest_spool(engine, spool_dir)
    assert (res.ingested, res.quarantined, res.failed) == (0, 0, 1)
    assert len(list(spool.pending(spool_dir))) == 1


def test_limit_and_progress(db, spool_dir):
    now = time.time()
    for j in range(50, 55):
        path = spool.write_record(spool_dir, make_record(j, gpus=1))
        os.utime(path, (now - j, now - j))  # job 54's record is the oldest
    seen = []
    res = ingest_spool(db, spool_dir, limit=3, progress=lambda done, total: seen.append((done, total)))
    assert res.ingested == 3 and seen[-1] == (3, 3)
    left = sorted(os.path.basename(p) for p in spool.pending(spool_dir))
    assert [n.split("-")[1] for n in left] == ["50", "51"]  # a limited run takes the oldest first


@pytest.mark.process
def test_records_written_by_the_real_hooks_ingest(tmp_path, db):
    site = HookSite(str(tmp_path / "node"))
    site.run("prolog", 60)
    site.run("epilog", 60, SLURM_JOB_EXIT_CODE2="1:0")
    site.run("epilog", 61)  # no prolog: unknown start
    res = ingest_spool(db, site.spool)
    assert (res.ingested, res.quarantined) == (2, 0)
    job, gpus = the_job(db, 60)
    assert job.state == "FAILED" and job.gpu_count == 2 and gpus[0].source == "simulated"
    assert the_job(db, 61)[0].start_time is None


def test_a_later_node_record_moving_the_end_into_another_month_marks_the_old_month(db, spool_dir):
    """Node n2 of a two-node job ends after midnight of 1 Feb: the job's end moves from January to February,
    so January's rollups (which may count the job) are noted as pending for the next refresh."""
    from datetime import date

    import synthetic

    from slurm_gpueff.models import RollupPending
    from slurm_gpueff.storage.rollups import dirty_months

    jan = datetime(2024, 1, 31, 23, 50, tzinfo=UTC).timestamp()
    feb = datetime(2024, 2, 1, 0, 10, tzinfo=UTC).timestamp()
    spool.write_record(spool_dir, synthetic.record(77, node="n1", gpus=1, end=jan))
    assert ingest_spool(db, spool_dir).ingested == 1
    with Session(db) as s:
        assert s.exec(select(RollupPending)).all() == []
    spool.write_record(spool_dir, synthetic.record(77, node="n2", gpus=1, end=feb))
    assert ingest_spool(db, spool_dir).ingested == 1
    with Session(db) as s:
        assert [p.month for p in s.exec(select(RollupPending)).all()] == [date(2024, 1, 1)]
        job = s.exec(select(Job).where(Job.job_id == 77)).one()
        assert job.end_time == datetime(2024, 2, 1, 0, 10)
    with db.connect() as conn:
        assert date(2024, 1, 1) in dirty_months(conn, now=datetime(2024, 3, 5))


def test_in_memory_sqlite_database_ingests(spool_dir):
    for j in range(30):
        spool.write_record(spool_dir, make_record(100 + j, gpus=1))
    engine = make_engine("sqlite://")
    assert ingest_spool(engine, spool_dir, batch=10).ingested == 30
    with Session(engine) as s:
        assert len(s.exec(select(Job)).all()) == 30


def test_a_bug_in_the_writer_keeps_the_files(db, spool_dir, monkeypatch):
    """An unexpected error while writing (a bug, not a record or the database) quarantines nothing and
    loses nothing: every record is retried alone, all fail alike, and the files stay for the next run."""
    from slurm_gpueff.storage import ingest

    for j in range(60):
        spool.write_record(spool_dir, make_record(200 + j, gpus=1))

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(ingest, "write_records", broken)
    res = ingest_spool(db, spool_dir, batch=10)
    assert res.ingested == 0 and res.failed == 60 and res.quarantined == 0
    assert any("RuntimeError: bug" in e and "software or schema problem" in e for e in res.errors)
    assert len(list(spool.pending(spool_dir))) == 60
    monkeypatch.undo()
    assert ingest_spool(db, spool_dir).ingested == 60


def test_a_concurrent_writer_is_waited_for_not_merged_over(tmp_path, spool_dir):
    """Job 7 is stored (node n2). Another writer holds a transaction that adds node n1 while ingest takes
    node n0: ingest waits for its commit (it reads under the write lock), then merges all three nodes."""
    from dbrows import ingest_beside_a_writer

    got = ingest_beside_a_writer(make_engine(str(tmp_path / "a.db")), spool_dir, make_engine(str(tmp_path / "ref.db")))
    assert {k[1] for k in got["job_gpu"]} == {"n0", "n1", "n2"}


@pytest.mark.process
def test_cli_ingest_takes_the_good_records_and_quarantines_the_bad(tmp_path):
    """``gpueff ingest``: 20 records in, 2 bad ones quarantined, the spool empty; ``--workers`` (it never did
    anything: ingest runs in one process) is gone, refused in one line."""
    import subprocess
    import sys

    from hooksite import ROOT

    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[site]\ncluster = "t"\n[paths]\nspool_dir = "{tmp_path}/spool"\n'
                   f'state_dir = "{tmp_path}/run"\ndatabase = "{tmp_path}/db/gpueff.db"\n')
    for j in range(20):
        spool.write_record(str(tmp_path / "spool"), make_record(300 + j, gpus=1))
    inc = tmp_path / "spool" / "incoming"
    (inc / "job-9999-n0.json").write_text("{not json")
    (inc / "job-9998-n0.json").write_text(json.dumps({"schema": 1, "cluster": "c"}))
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = [sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg), "ingest"]
    bad = subprocess.run([*run, "--workers", "2"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "unrecognized arguments: --workers 2" in bad.stderr
    assert len(bad.stderr.splitlines()) == 1, bad.stderr
    p = subprocess.run(run, capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "ingested 20, quarantined 2, failed 0" in p.stdout
    assert os.listdir(inc) == []
