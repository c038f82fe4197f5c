"""Ingest gives the same rows on real PostgreSQL as on SQLite (bad records quarantined, later node records
merged), re-ingest changes nothing, concurrent writers do not overwrite each other, an unreachable server
loses nothing; the single-record ORM entry point agrees with the batch path."""

from __future__ import annotations

import json
import os
import random

import pytest
import synthetic
from dbrows import ingest_beside_a_writer, rows
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlmodel import Session

from slurm_gpueff import spool
from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.writer import ingest_record


def records() -> list[dict]:
    rng = random.Random(3)
    out = []
    for i in range(120):
        rec = synthetic.record(1000 + i % 80, rng=rng, node=f"n{i % 3}", timeline_points=3)  # multi-node jobs
        out.append(rec)
    return out


def load(url: str, tmp_path, name: str):  # noqa: ANN001
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    d = str(tmp_path / name)
    for rec in records():
        spool.write_record(d, rec)
    res = ingest_spool(engine, d, batch=37)
    assert (res.ingested, res.failed, res.quarantined) == (120, 0, 0)
    first = rows(engine)
    for rec in records():  # replay everything
        spool.write_record(d, rec)
    assert ingest_spool(engine, d).ingested == 120
    assert rows(engine) == first
    return engine, first


@pytest.mark.postgres
def test_postgres_ingest_equals_sqlite(pg_url, tmp_path):  # noqa: F811
    _e1, lite = load(f"sqlite:///{tmp_path}/a.db", tmp_path, "s1")
    _e2, pg = load(pg_url, tmp_path, "s2")
    assert lite.keys() == pg.keys()
    for k in lite:
        assert lite[k] == pg[k], k
    assert len(lite["job"]) == 80


def test_single_record_entry_point_matches_the_batch_path(tmp_path):
    _e, batch = load(f"sqlite:///{tmp_path}/a.db", tmp_path, "s1")
    engine = make_engine(f"sqlite:///{tmp_path}/b.db")
    for rec in records():
        with Session(engine) as s:
            job = ingest_record(s, rec)
            s.commit()
            assert job.job_id == rec["job_id"]
    assert rows(engine) == batch


def mixed_records(n: int = 240, seed: int = 5) -> list[dict]:
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


def ingest_all(url: str, d: str) -> dict:
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    recs = mixed_records()
    fill(d, recs[:200])
    first = ingest_spool(engine, d, batch=40)
    assert (first.ingested, first.quarantined, first.failed) == (200, 2, 0), first.errors
    fill(d, recs[200:], bad=False)  # later node records of jobs already stored: the merge path
    assert ingest_spool(engine, d, batch=40).ingested == 40
    assert list(spool.pending(d)) == []
    assert len(os.listdir(os.path.join(d, spool.QUARANTINE))) == 4  # two records, two .error files
    stored = rows(engine)
    fill(d, recs, bad=False)  # replay everything: same rows, no duplicates
    assert ingest_spool(engine, d, batch=40).ingested == 240
    assert rows(engine) == stored
    engine.dispose()
    return stored


@pytest.mark.postgres
def test_postgres_with_quarantine_merge_and_replay_equals_sqlite(pg_url, tmp_path):  # noqa: F811
    lite = ingest_all(f"sqlite:///{tmp_path}/a.db", str(tmp_path / "s1"))
    assert ingest_all(pg_url, str(tmp_path / "s2")) == lite
    assert len(lite["job"]) == 150 and len(lite["job_gpu"]) > 300


def test_unreachable_database_loses_nothing(tmp_path):
    d = str(tmp_path / "s")
    fill(d, mixed_records(60), bad=False)
    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none?connect_timeout=2", create=False)
    res = ingest_spool(engine, d, batch=10)
    assert res.ingested == 0 and res.failed == 60
    assert any("database unavailable" in e for e in res.errors)
    assert len(list(spool.pending(d))) == 60


@pytest.mark.postgres
@pytest.mark.parametrize("stored_first", [True, False])
def test_postgres_concurrent_writers_of_one_job_both_count(pg_url, tmp_path, stored_first):  # noqa: F811
    """Another writer holds a transaction adding node n1 of job 7 while ingest takes node n0. Job stored
    before: ingest's read waits on the job row's lock, then merges. New job: ingest's insert meets the
    other's at the unique key, and its record, retried alone, merges. Either way in one run, and the
    rows are those of the three records written one after the other."""
    engine = make_engine(pg_url, create=False)
    migrate.upgrade(engine)
    ingest_beside_a_writer(engine, str(tmp_path / "s"), make_engine(f"sqlite:///{tmp_path}/ref.db"), stored_first)
    engine.dispose()
