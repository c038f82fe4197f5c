"""Ingest's fast write path stores byte-for-byte what SQLAlchemy Core stores, and leaves the process as it
found it.

The raw DBAPI path (storage/ingest.py ``_write_raw``) formats values itself: JSON through the engine's
serializer with constants for ``null``/``{}``, times memoised per batch, ids read back by natural key.
The generic path (``write_records`` on any other dialect) goes through SQLAlchemy Core. Both run here on
real SQLite files and the stored text of every column is compared, including multi-node jobs, a node
that reports again, and the optional DCGM/MIG fields.
"""

from __future__ import annotations

import gc
import random
import sqlite3

import pytest

from slurm_gpueff import spool, synthetic
from slurm_gpueff.storage import ingest
from slurm_gpueff.storage.db import make_engine

TABLES = {"job": "cluster, job_id", "job_gpu": "job_pk, node, gpu_index", "job_gpu_timeline": "job_gpu_id"}


def records() -> list[dict]:
    rng = random.Random(11)
    out = []
    for i in range(60):
        rec = synthetic.record(500 + i % 40, rng=rng, node=f"n{i % 2}", timeline_points=4)
        if i % 7 == 0:  # DCGM / MIG extras on some GPUs
            rec["gpus"][0].update(xid_errors=2, throttle_s={"power": 1.5}, processes=[123, 456],
                                  mig_uuid="MIG-abc", mig_profile="1g.10gb")
        out.append(rec)
    return out


def stored_text(path: str) -> dict[str, list[tuple]]:
    """Every column of every row as SQLite stores it (type and text), ingest times left out."""
    con = sqlite3.connect(path)
    out = {}
    for table, order in TABLES.items():
        cols = [r[1] for r in con.execute(f"PRAGMA table_info({table})") if r[1] not in ("ingested_at",)]
        sel = ", ".join(f'typeof("{c}"), CAST("{c}" AS TEXT)' for c in cols)
        out[table] = con.execute(f"SELECT {sel} FROM {table} ORDER BY {order}").fetchall()
    con.close()
    return out


def load(tmp_path, name: str, monkeypatch: pytest.MonkeyPatch | None = None) -> dict[str, list[tuple]]:
    path = str(tmp_path / f"{name}.db")
    engine = make_engine(path)
    d = str(tmp_path / f"spool-{name}")
    recs = records()
    for rec in recs[:40]:
        spool.write_record(d, rec)
    assert ingest.ingest_spool(engine, d, batch=9).ingested == 40
    for rec in recs[40:]:  # second run: updates of existing jobs and GPU rows
        spool.write_record(d, rec)
    assert ingest.ingest_spool(engine, d, batch=7).ingested == 20
    engine.dispose()
    return stored_text(path)


def test_raw_path_stores_what_sqlalchemy_core_stores(tmp_path, monkeypatch):
    fast = load(tmp_path, "fast")
    monkeypatch.setattr(ingest, "_RAW_DIALECTS", ())  # SQLite through the generic Core path
    core = load(tmp_path, "core")
    assert len(fast["job"]) == 40 and len(fast["job_gpu"]) > 40
    assert any('"power":1.5' in str(row) for row in fast["job_gpu"])
    for table in TABLES:
        assert fast[table] == core[table], table


@pytest.mark.parametrize("enabled", [True, False])
def test_ingest_leaves_the_garbage_collector_as_it_found_it(tmp_path, enabled):
    engine = make_engine(str(tmp_path / "gc.db"))
    d = str(tmp_path / "spool")
    for rec in records()[:5]:
        spool.write_record(d, rec)
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        assert ingest.ingest_spool(engine, d, batch=2).ingested == 5
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()
