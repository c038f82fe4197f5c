"""Ingest's raw write path stores byte-for-byte what SQLAlchemy Core stores, and leaves the process as it
found it.

The writer (storage/writer.py) binds values itself: JSON through the engine's serializer with constants
for ``null``/``{}``, times memoised per batch. Here ingest fills a real SQLite file (multi-node jobs, a
node that reports again, the optional DCGM/MIG fields); its rows, read back through SQLAlchemy, are
written again through Core's ``insert`` into a second file, and the stored text of every column of the
two files is compared.
"""

from __future__ import annotations

import gc
import random
import sqlite3

import pytest
import synthetic
from sqlalchemy import insert, select

from slurm_gpueff import spool
from slurm_gpueff.models import Job, JobGpu, JobGpuTimeline
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


def load(tmp_path) -> str:
    path = str(tmp_path / "fast.db")
    engine = make_engine(path)
    d = str(tmp_path / "spool")
    recs = records()
    for rec in recs[:40]:
        spool.write_record(d, rec)
    assert ingest.ingest_spool(engine, d, batch=9).ingested == 40
    for rec in recs[40:]:  # second run: updates of existing jobs and GPU rows
        spool.write_record(d, rec)
    assert ingest.ingest_spool(engine, d, batch=7).ingested == 20
    engine.dispose()
    return path


def core_copy(src: str, dest: str) -> None:
    """Every row of ``src`` read through SQLAlchemy and written again through Core, ids included."""
    a, b = make_engine(src), make_engine(dest)
    with a.connect() as read, b.begin() as write:
        for table in (Job.__table__, JobGpu.__table__, JobGpuTimeline.__table__):
            write.execute(insert(table), [dict(r) for r in read.execute(select(table)).mappings()])
    a.dispose()
    b.dispose()


def test_raw_path_stores_what_sqlalchemy_core_stores(tmp_path):
    fast = load(tmp_path)
    core_copy(fast, str(tmp_path / "core.db"))
    fast_text, core_text = stored_text(fast), stored_text(str(tmp_path / "core.db"))
    assert len(fast_text["job"]) == 40 and len(fast_text["job_gpu"]) > 40
    assert any('"power":1.5' in str(row) for row in fast_text["job_gpu"])
    for table in TABLES:
        assert fast_text[table] == core_text[table], table


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
