#!/usr/bin/env python3
"""``gpueff db copy`` of a SQLite history into PostgreSQL, timed, with the row counts of both sides.

    python3 bench/db_copy.py [--jobs 100000] [--db PATH] [--pg postgresql+psycopg://postgres@127.0.0.1:5432]

Builds (or reuses: an existing ``--db`` is used as it is) a SQLite history the way a site gets one: the
tests' synthetic records (one to eight GPUs, ten timeline points each, a quarter of the jobs on a second
node) through the real spool and ``ingest_spool``, the job summaries, the rollups. Then creates an empty
database on the PostgreSQL server ``--pg``, runs ``gpueff db copy --from`` into it as an admin would
(a config naming it), prints the command's output and wall time, counts each table on both sides itself,
and drops the database (``--keep`` leaves it).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package, and the synthetic records of the tests

import psycopg  # noqa: E402
import synthetic  # noqa: E402
from sqlalchemy import func, select  # noqa: E402
from sqlmodel import SQLModel  # noqa: E402

from slurm_gpueff import spool  # noqa: E402
from slurm_gpueff.config import Config  # noqa: E402
from slurm_gpueff.service.summarize import summarize_pending  # noqa: E402
from slurm_gpueff.storage import rollups  # noqa: E402
from slurm_gpueff.storage.db import make_engine  # noqa: E402
from slurm_gpueff.storage.ingest import ingest_spool  # noqa: E402

CHUNK = 20_000


def build(path: str, jobs: int) -> None:
    engine = make_engine(path)
    rng = random.Random(11)
    with tempfile.TemporaryDirectory(prefix="gpueff-copy-bench-") as d:
        second = jobs // 4
        ids = [*range(1, jobs + 1), *range(1, second + 1)]  # a quarter of the jobs ran on two nodes
        for lo in range(0, len(ids), CHUNK):
            for n, jid in enumerate(ids[lo:lo + CHUNK], start=lo):
                node = f"gpu{jid % 500:03d}" if n < jobs else f"gpu{(jid + 1) % 500:03d}"
                spool.write_record(d, synthetic.record(jid, rng=rng, node=node, end=1.70e9 + jid * 30.0))
            res = ingest_spool(engine, d)
            assert res.failed == 0 and res.quarantined == 0, res.errors
            print(f"  ingested {min(lo + CHUNK, len(ids)):,} of {len(ids):,} records", flush=True)
    analysed = summarize_pending(engine, Config().analysis)
    res_r = rollups.refresh(engine, full=True)
    print(f"  {analysed:,} jobs analysed, {res_r.rows:,} rollup rows")
    engine.dispose()


def counts(url: str) -> dict[str, int]:
    engine = make_engine(url, create=False)
    with engine.connect() as conn:
        out = {t.name: conn.execute(select(func.count()).select_from(t)).scalar_one()
               for t in SQLModel.metadata.sorted_tables}
    engine.dispose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jobs", type=int, default=100_000)
    ap.add_argument("--db", default="/tmp/gpueff-bench-copy.db", help="SQLite history to build or reuse")
    ap.add_argument("--pg", default="postgresql+psycopg://postgres@127.0.0.1:5432", help="PostgreSQL server")
    ap.add_argument("--keep", action="store_true", help="keep the PostgreSQL database")
    a = ap.parse_args()
    if not os.path.exists(a.db):
        t = time.perf_counter()
        print(f"building {a.db}: {a.jobs:,} jobs through the spool and ingest")
        build(a.db, a.jobs)
        print(f"built in {time.perf_counter() - t:.0f} s, {os.path.getsize(a.db) / 1e6:,.0f} MB")
    else:
        print(f"reusing {a.db} as it is ({os.path.getsize(a.db) / 1e6:,.0f} MB)")
    name = f"gpueff_copy_{uuid.uuid4().hex[:8]}"
    admin = a.pg.replace("postgresql+psycopg://", "postgresql://") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'CREATE DATABASE "{name}"')
    url = f"{a.pg}/{name}"
    try:
        with tempfile.NamedTemporaryFile("w", suffix=".toml") as cfg:
            cfg.write(f'[paths]\ndatabase = "{url}"\n')
            cfg.flush()
            t = time.perf_counter()
            p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", cfg.name, "db", "copy",
                                "--from", a.db], capture_output=True, text=True)
            wall = time.perf_counter() - t
        print(p.stdout + p.stderr, end="")
        print(f"gpueff db copy: exit {p.returncode}, {wall:.1f} s wall (the command's process, start to end)")
        src, dst = counts(a.db), counts(url)
        for t_name in src:
            print(f"  counted here: {t_name:<18} SQLite {src[t_name]:>10,}  PostgreSQL {dst[t_name]:>10,}"
                  + ("" if src[t_name] == dst[t_name] else "  DIFFERENT"))
        print("equal" if src == dst else "NOT EQUAL")
        return 0 if p.returncode == 0 and src == dst else 1
    finally:
        if not a.keep:
            with psycopg.connect(admin, autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
