"""Parallel ingest (``[service] ingest_workers``, storage/ingest_parallel.py) stores exactly what one process
stores, on real SQLite files and on the real PostgreSQL server, and keeps the spool's guarantees: bad
records quarantined, nothing lost when the database is unreachable or a worker process is killed, nothing
duplicated on replay. Worker processes are real (fork, and the fork server from a threaded process)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading

import pytest
from dbrows import rows
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlalchemy import select

from slurm_gpueff import spool, synthetic
from slurm_gpueff.models import Job
from slurm_gpueff.storage import ingest, migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest_parallel import SqliteTurn, batches, id_counters

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
def records(n: int = 240, seed: int = 5) -> list[dict]:
    """150 jobs on node n0, then second node records (n1) of the first ones: two-node jobs."""
    rng = random.Random(seed)
    return [synthetic.record(2000 + i % 150, rng=rng, node=f"n{i // 150}", timeline_points=3) for i in range(n)]


def fill(d: str, recs: list[dict], bad: bool = True) -> None:
    for rec in recs:
        spool.write_record(d, rec)
    if bad:
        inc = os.path.join(d, spool.INCOMING)
        with open(os.path.join(inc, "job-9999-n0.json"), "w") as fh:
            fh.write("{not json")
        with open(os.path.join(inc, "job-9998-n0.json"), "w") as fh:
            fh.write(json.dumps({"schema": 1, "cluster": "c"}))  # required fields missing


def engine_for(url: str):  # noqa: ANN201
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    return engine


def ingest_all(url: str, d: str, workers: int, monkeypatch: pytest.MonkeyPatch) -> tuple[dict, ingest.IngestResult]:
    monkeypatch.setattr(ingest, "PARALLEL_MIN", 10)  # exercise the worker processes on a test-sized spool
    engine = engine_for(url)
    recs = records()
    fill(d, recs[:200])
    first = ingest.ingest_spool(engine, d, workers=workers, batch=40)
    assert (first.ingested, first.quarantined, first.failed) == (200, 2, 0), first.errors
    fill(d, recs[200:], bad=False)  # later node records of jobs already stored: the merge path
    assert ingest.ingest_spool(engine, d, workers=workers, batch=40).ingested == 40
    assert list(spool.pending(d)) == []
    assert len(os.listdir(os.path.join(d, spool.QUARANTINE))) == 4  # two records, two .error files
    stored = rows(engine)
    fill(d, recs, bad=False)  # replay everything: same rows, no duplicates
    assert ingest.ingest_spool(engine, d, workers=workers, batch=40).ingested == 240
    assert rows(engine) == stored
    engine.dispose()
    return stored, first


def test_batches_keep_a_jobs_node_records_together():
    # node records arrive interleaved; spool.group_by_job gathers each job's, as spool.pending_by_job does
    paths = [f"/s/incoming/job-{j}-n{n}.json" for n in range(3) for j in range(100)] + ["/s/incoming/odd.json"]
    jobs = spool.group_by_job(paths)
    cut = batches(jobs, step=40, workers=4)
    assert sorted(p for b in cut for p in b) == sorted(paths)
    where = {p.split("-")[1]: i for i, b in enumerate(cut) for p in b if "job-" in p}
    assert all(where[p.split("-")[1]] == i for i, b in enumerate(cut) for p in b if "job-" in p)
    # 301 files for 4 workers: batches of at most max(50, min(40, ceil(301 / 16))) = 50 files, i.e. 16 whole
    # three-node jobs (48 files) each, after three that ramp up to it: at most 12, 25 and 37 files
    assert [len(b) for b in cut] == [12, 24, 36] + [48] * 4 + [37]
    assert [len(b) for b in batches(jobs, step=40, workers=1)] == [48] * 6 + [13]  # one worker: no ramp


def test_sqlite_parallel_equals_serial(tmp_path, monkeypatch):
    serial, _ = ingest_all(f"sqlite:///{tmp_path}/a.db", str(tmp_path / "s1"), 1, monkeypatch)
    parallel, _ = ingest_all(f"sqlite:///{tmp_path}/b.db", str(tmp_path / "s2"), 3, monkeypatch)
    assert parallel == serial
    assert len(serial["job"]) == 150 and len(serial["job_gpu"]) > 300


@pytest.mark.postgres
def test_postgres_parallel_equals_serial_sqlite(pg_url, tmp_path, monkeypatch):  # noqa: F811
    serial, _ = ingest_all(f"sqlite:///{tmp_path}/a.db", str(tmp_path / "s1"), 1, monkeypatch)
    parallel, _ = ingest_all(pg_url, str(tmp_path / "s2"), 4, monkeypatch)
    assert parallel == serial


class OtherWriterFirst:
    """A 'lock' under which another writer commits first: what a worker waiting for its turn may meet."""

    def __init__(self, engine, recs: list[dict]) -> None:  # noqa: ANN001
        self.engine, self.recs = engine, recs

    def __enter__(self) -> None:
        with self.engine.begin() as conn:
            ingest.write_records(conn, self.recs)

    def __exit__(self, *exc: object) -> None:
        pass


@pytest.mark.parametrize("reserve", [False, True])
def test_a_plan_made_stale_by_another_writer_is_made_again(tmp_path, reserve):
    """Another writer stores a node record of the same job between planning and writing: the batch is
    planned again under the lock and both nodes' GPUs are kept (with and without reserved ids)."""
    a, b = (synthetic.record(7, rng=random.Random(1), node=n, timeline_points=2) for n in ("n0", "n1"))
    engine = make_engine(f"sqlite:///{tmp_path}/a.db")
    turn = SqliteTurn(OtherWriterFirst(engine, [b]), id_counters(engine) if reserve else None)
    ingest._write_batch(engine, [a], turn)
    ref = make_engine(f"sqlite:///{tmp_path}/ref.db")
    for rec in (b, a):
        with ref.begin() as conn:
            ingest.write_records(conn, [rec])
    assert rows(engine) == rows(ref)
    assert {k[1] for k in rows(engine)["job_gpu"]} == {"n0", "n1"}


def test_a_job_stored_meanwhile_is_seen_even_outside_the_reserved_ids(tmp_path):
    """Another writer stores one of the batch's jobs with ids below the reserved ranges (as when other
    workers hold the ids in between): only the check of the jobs' keys can see that the prepared rows no
    longer hold. The turn must plan again rather than insert the job twice (which SQLite would refuse,
    and ``turn.write`` would raise)."""
    a, b = (synthetic.record(7, rng=random.Random(1), node=n, timeline_points=2) for n in ("n0", "n1"))
    engine = make_engine(f"sqlite:///{tmp_path}/a.db")
    ids = id_counters(engine)
    ids["job"].value, ids["job_gpu"].value = 50, 500
    SqliteTurn(OtherWriterFirst(engine, [b]), ids).write(engine, [a])
    ref = make_engine(f"sqlite:///{tmp_path}/ref.db")
    for rec in (b, a):
        with ref.begin() as conn:
            ingest.write_records(conn, [rec])
    assert rows(engine) == rows(ref)


def test_reserved_ids_taken_by_another_writer_are_not_reused(tmp_path):
    """Enrichment or a forwarder inserts a job between a worker's reservation and its turn; SQLite gives
    it the next id, inside the reserved range: the worker notices and plans again with fresh ids."""
    ours = [synthetic.record(100 + i, rng=random.Random(i), timeline_points=2) for i in range(5)]
    other = synthetic.record(999, rng=random.Random(9), timeline_points=2)
    engine = make_engine(f"sqlite:///{tmp_path}/a.db")
    turn = SqliteTurn(OtherWriterFirst(engine, [other]), id_counters(engine))
    ingest._write_batch(engine, ours, turn)
    ref = make_engine(f"sqlite:///{tmp_path}/ref.db")
    with ref.begin() as conn:
        ingest.write_records(conn, [other, *ours])
    assert rows(engine) == rows(ref)
    with engine.connect() as conn:  # every GPU row belongs to the job it was measured for
        pairs = conn.exec_driver_sql("SELECT j.job_id, count(*) FROM job_gpu g JOIN job j ON j.id = g.job_pk "
                                     "GROUP BY j.job_id").all()
    assert dict(pairs) == {r["job_id"]: len(r["gpus"]) for r in [other, *ours]}


def test_prepared_batches_take_the_reserved_ids(tmp_path):
    """Without interference a batch of new jobs is written with exactly the ids it reserved."""
    recs = [synthetic.record(200 + i, rng=random.Random(i), timeline_points=2) for i in range(4)]
    engine = make_engine(f"sqlite:///{tmp_path}/a.db")
    ids = id_counters(engine)
    ids["job"].value, ids["job_gpu"].value = 50, 500  # a gap, as when other workers hold the ids below
    ingest._write_batch(engine, recs, SqliteTurn(threading.Lock(), ids))
    with engine.connect() as conn:
        job_ids = [r[0] for r in conn.exec_driver_sql("SELECT id FROM job ORDER BY id")]
        gpu_ids = [r[0] for r in conn.exec_driver_sql("SELECT id FROM job_gpu ORDER BY id")]
    n_gpus = sum(len(r["gpus"]) for r in recs)
    assert job_ids == [50, 51, 52, 53] and gpu_ids == list(range(500, 500 + n_gpus))
    assert (ids["job"].value, ids["job_gpu"].value) == (54, 500 + n_gpus)


def test_in_memory_sqlite_is_never_shared_with_workers(tmp_path, monkeypatch):
    """Each worker would open its own empty in-memory database: one process does the work instead."""
    monkeypatch.setattr(ingest, "PARALLEL_MIN", 10)
    d = str(tmp_path / "s")
    fill(d, records(30), bad=False)
    engine = make_engine("sqlite://")
    assert ingest.ingest_spool(engine, d, workers=4, batch=10).ingested == 30
    with engine.connect() as conn:
        assert len(conn.execute(select(Job.__table__)).all()) == 30


def test_unreachable_database_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(ingest, "PARALLEL_MIN", 10)
    d = str(tmp_path / "s")
    fill(d, records(60), bad=False)
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2", create=False)
    res = ingest.ingest_spool(engine, d, workers=3, batch=10)
    assert res.ingested == 0 and res.failed == 60
    assert any("database unavailable" in e for e in res.errors)
    assert len(list(spool.pending(d))) == 60


def test_killed_worker_loses_nothing_and_a_rerun_stores_each_record_once(tmp_path, monkeypatch):
    """kill -9 of a worker process in the middle of a batch: that batch's files stay in the spool, the
    pool reports the loss, and the next run stores every record exactly once."""
    monkeypatch.setattr(ingest, "PARALLEL_MIN", 10)
    d = str(tmp_path / "s")
    recs = records(120)
    fill(d, recs, bad=False)
    victim = spool.record_name(recs[50]["job_id"], recs[50]["node"])
    real = ingest.read_record

    def read_or_die(path: str) -> dict:
        if os.path.basename(path) == victim:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(path)

    monkeypatch.setattr(ingest, "read_record", read_or_die)  # inherited by the forked workers
    engine = make_engine(f"sqlite:///{tmp_path}/a.db")
    res = ingest.ingest_spool(engine, d, workers=3, batch=10)
    assert res.failed > 0 and any("worker died" in e for e in res.errors)
    assert res.ingested + res.failed == 120
    assert len(list(spool.pending(d))) == res.failed  # every file not committed is still there
    monkeypatch.setattr(ingest, "read_record", real)
    again = ingest.ingest_spool(engine, d, workers=1)
    assert again.ingested == res.failed and list(spool.pending(d)) == []
    ref = make_engine(f"sqlite:///{tmp_path}/ref.db")
    with ref.begin() as conn:
        ingest.write_records(conn, recs)
    assert rows(engine) == rows(ref)


def test_threaded_caller_gets_fork_server_workers(tmp_path, monkeypatch):
    """`gpueff serve` runs ingest in a scheduler thread: workers then come from the fork server."""
    monkeypatch.setattr(ingest, "PARALLEL_MIN", 10)
    stop = threading.Event()
    t = threading.Thread(target=stop.wait, daemon=True)
    t.start()
    try:
        assert threading.active_count() > 1
        d = str(tmp_path / "s")
        fill(d, records(60), bad=False)
        engine = make_engine(f"sqlite:///{tmp_path}/a.db")
        res = ingest.ingest_spool(engine, d, workers=2, batch=10)
    finally:
        stop.set()
    assert (res.ingested, res.failed) == (60, 0), res.errors
    assert list(spool.pending(d)) == []


def test_cli_workers_option(tmp_path):
    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[site]\ncluster = "t"\n[paths]\nspool_dir = "{tmp_path}/spool"\n'
                   f'state_dir = "{tmp_path}/run"\ndatabase = "{tmp_path}/db/gpueff.db"\n')
    fill(str(tmp_path / "spool"), [synthetic.record(i + 1, timeline_points=2) for i in range(ingest.PARALLEL_MIN)])
    env = dict(os.environ, PYTHONPATH=ROOT)
    run = [sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg), "ingest"]
    bad = subprocess.run([*run, "--workers", "65"], capture_output=True, text=True, env=env, timeout=60)
    assert bad.returncode == 2 and "--workers" in bad.stderr
    p = subprocess.run([*run, "--workers", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert f"ingested {ingest.PARALLEL_MIN}, quarantined 2, failed 0" in p.stdout
    assert os.listdir(tmp_path / "spool" / "incoming") == []


@pytest.mark.parametrize("cpus, setting, sqlite, postgres", [
    (1, 0, 1, 1), (2, 0, 2, 2), (3, 0, 2, 2), (6, 0, 3, 4), (16, 0, 8, 12), (64, 0, 8, 12), (None, 0, 1, 1),
    (16, 3, 3, 3)])
def test_automatic_worker_count(monkeypatch, cpus, setting, sqlite, postgres):
    monkeypatch.setattr(os, "cpu_count", lambda: cpus)
    assert ingest.worker_count(setting, "sqlite") == sqlite
    assert ingest.worker_count(setting, "postgresql") == postgres


def test_a_failing_worker_keeps_its_files_and_stops_the_run(tmp_path, monkeypatch):
    """An unexpected error inside a worker (a bug, not a record or the database) loses nothing."""
    monkeypatch.setattr(ingest, "PARALLEL_MIN", 10)
    d = str(tmp_path / "s")
    fill(d, records(60), bad=False)

    def broken(*_a: object, **_k: object) -> None:
        raise RuntimeError("bug")

    monkeypatch.setattr(ingest, "drain_batch", broken)  # inherited by the forked workers
    res = ingest.ingest_spool(make_engine(f"sqlite:///{tmp_path}/a.db"), d, workers=2, batch=10)
    assert res.ingested == 0 and res.failed == 60
    assert any("RuntimeError: bug" in e for e in res.errors)
    assert len(list(spool.pending(d))) == 60
