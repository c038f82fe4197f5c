"""Ingest (the set-based batch path) gives the same rows on real PostgreSQL as on SQLite, and re-ingest
changes nothing; the single-record ORM entry point agrees with the batch path."""

from __future__ import annotations

import random

import pytest
from dbrows import rows
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlmodel import Session

from slurm_gpueff import spool, synthetic
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
