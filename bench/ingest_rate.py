#!/usr/bin/env python3
"""Ingest rate (spool files -> database, ``ingest_spool``, one process) against two floors measured in the
same run, and the time it takes to drain a backlog of 1,000,000 spooled records at that rate.

    python3 bench/ingest_rate.py [--records N] [--repeat K] [--postgres URL | --no-postgres]

Records are tests/synthetic.py ones (1-8 GPUs, mean ~3.2; 10 timeline points per GPU, rounded as the
collectors round them; a fifth pre-Hopper), written into a spool exactly as the Epilog writes them
(one fsync'd file each). Three things are timed, K times each, interleaved, and the medians reported:

* **ingest**: ``ingest_spool`` from the spool into an empty migrated database, files removed at the end;
* **executemany floor**: the same rows (job, job_gpu, timeline; JSON text included) built *before* the
  timer, then only one ``executemany`` per table and the commit: the database's own cost for these
  rows, with no files, parsing, validation or merging. On PostgreSQL the floor uses ``INSERT ..
  RETURNING`` to learn the ids the child rows need (ingest uses COPY and reads the ids back);
* **spool floor**: reading every file of an identical spool and removing it (threads, as ingest
  does), with no parsing: the file system's own cost of draining one fsync'd file per record.

Ratios are ingest time over floor time. Goal: >= 3,000 records/s into each database, one process: a
site of 10,000 GPUs ends ~100,000 jobs a day (1-2 records/s), and a week-long database outage leaves a
backlog of ~1 M records, which that rate drains in under six minutes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package, and the synthetic records of the tests

import synthetic  # noqa: E402

from slurm_gpueff import spool  # noqa: E402
from slurm_gpueff.storage import migrate  # noqa: E402
from slurm_gpueff.storage.db import json_dumps, make_engine  # noqa: E402
from slurm_gpueff.storage.ingest import ingest_spool  # noqa: E402

JOB_COLS = ("cluster", "job_id", "user", "uid", "account", "partition", "gpu_count", "start_time", "end_time",
            "elapsed_s", "state", "exit_code", "signal", "backend", "record_source", "enriched", "nodelist",
            "gpu_type", "ingested_at")
GPU_COLS = ("job_pk", "node", "gpu_index", "minor", "uuid", "pci_bus_id", "model", "memory_total_bytes",
            "start_time", "end_time", "kernel_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
            "fp64_active", "fp32_active", "fp16_active", "memory_used_peak_bytes", "energy_j", "power_mean_w",
            "source", "samples", "missing", "throttle_s", "processes")
METRICS = GPU_COLS[10:21]
GOAL = 3000  # records/s, one process, each database
BACKLOG = 1_000_000  # spooled records after a week-long database outage at a 10,000-GPU site


def _ts(epoch: float, text: bool) -> object:
    dt = datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)
    return dt.strftime("%Y-%m-%d %H:%M:%S.%f") if text else dt  # SQLite stores SQLAlchemy's text form


def floor_rows(recs: list[dict], text_times: bool) -> tuple[list[tuple], list[tuple], list[str]]:
    """job rows, job_gpu rows (job_pk = 1-based record position) and timeline JSON, as parameter tuples."""
    jobs, gpus, tls = [], [], []
    now = _ts(time.time(), text_times)
    for pk, r in enumerate(recs, 1):
        start, end = _ts(r["start_time"], text_times), _ts(r["end_time"], text_times)
        jobs.append((r["cluster"], r["job_id"], r["user"], r["uid"], r["account"], r["partition"], len(r["gpus"]),
                     start, end, r["end_time"] - r["start_time"], "COMPLETED", r["exit_code"], r["signal"],
                     r["backend"], "hook", False, r["node"], "Synthetic H100", now))
        for g in r["gpus"]:
            gpus.append((pk, r["node"], g["index"], g["minor"], g["uuid"], g["pci_bus_id"], g["model"],
                         g["memory_total_bytes"], start, end, *[g[k] for k in METRICS], g["source"], g["samples"],
                         json_dumps(g["missing"]), "null", "null"))
            tls.append(json_dumps(g["timeline"]))
    return jobs, gpus, tls


def _marks(n: int, ph: str) -> str:
    return ",".join([ph] * n)


def _quoted(cols: tuple[str, ...]) -> str:
    return ",".join(f'"{c}"' for c in cols)


def floor_sqlite(path: str, rows: tuple[list[tuple], list[tuple], list[str]]) -> float:
    import sqlite3

    jobs, gpus, tls = rows
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=FULL")
    con.execute("PRAGMA foreign_keys=ON")  # as the service's engine sets them (storage/db.py)
    t0 = time.perf_counter()
    con.executemany(f"INSERT INTO job ({_quoted(JOB_COLS)}) VALUES ({_marks(len(JOB_COLS), '?')})", jobs)
    con.executemany(f"INSERT INTO job_gpu ({_quoted(GPU_COLS)}) VALUES ({_marks(len(GPU_COLS), '?')})", gpus)
    con.executemany("INSERT INTO job_gpu_timeline (job_gpu_id, points) VALUES (?, ?)",
                    [(i, t) for i, t in enumerate(tls, 1)])
    con.commit()
    dt = time.perf_counter() - t0
    con.close()
    return dt


def _returned_ids(cur) -> list[int]:  # noqa: ANN001
    ids = []
    while True:
        ids.append(cur.fetchone()[0])
        if not cur.nextset():
            return ids


def floor_pg(url: str, rows: tuple[list[tuple], list[tuple], list[str]]) -> float:
    import psycopg

    jobs, gpus, tls = rows
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as con, con.cursor() as cur:
        t0 = time.perf_counter()
        cur.executemany(f"INSERT INTO job ({_quoted(JOB_COLS)}) VALUES ({_marks(len(JOB_COLS), '%s')}) RETURNING id",
                        jobs, returning=True)
        ids = _returned_ids(cur)
        cur.executemany(f"INSERT INTO job_gpu ({_quoted(GPU_COLS)}) VALUES ({_marks(len(GPU_COLS), '%s')}) "
                        "RETURNING id", [(ids[g[0] - 1], *g[1:]) for g in gpus], returning=True)
        gids = _returned_ids(cur)
        cur.executemany("INSERT INTO job_gpu_timeline (job_gpu_id, points) VALUES (%s, %s)",
                        list(zip(gids, tls, strict=True)))
        con.commit()
        return time.perf_counter() - t0


def write_spool(d: str, recs: list[dict]) -> str:
    sp = os.path.join(d, "spool-" + uuid.uuid4().hex[:6])
    for r in recs:
        spool.write_record(sp, r)
    os.sync()  # the files' writeback is not charged to whatever runs next
    return sp


def spool_floor(d: str, recs: list[dict]) -> float:
    """Read and remove every file of a spool (unlinks in 8 threads, like ingest): no parsing, no database."""
    sp = write_spool(d, recs)
    t0 = time.perf_counter()
    paths = [p for job in spool.pending_by_job(sp) for p in job]  # the listing ingest makes
    for p in paths:
        with open(p, "rb") as fh:
            fh.read()
    with ThreadPoolExecutor(8) as ex:
        list(ex.map(os.unlink, paths, chunksize=64))
    return time.perf_counter() - t0


def ingest_once(url: str, d: str, recs: list[dict]) -> float:
    sp = write_spool(d, recs)
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    t0 = time.perf_counter()
    res = ingest_spool(engine, sp)
    dt = time.perf_counter() - t0
    assert res.ingested == len(recs) and not res.failed, res.errors[:3]
    assert not list(spool.pending(sp)), "spool not drained"
    engine.dispose()
    return dt


def _pg_databases(admin: str, n: int) -> list[str]:
    import psycopg

    names = [f"gpueff_bench_{uuid.uuid4().hex[:8]}" for _ in range(n)]
    with psycopg.connect(admin, autocommit=True) as c:
        for name in names:
            c.execute(f'CREATE DATABASE "{name}"')
    return names


def _drop(admin: str, names: list[str]) -> None:
    import psycopg

    with psycopg.connect(admin, autocommit=True) as c:
        for name in names:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def report(label: str, n: int, gpus: int, ing: list[float], floor: list[float], fs: list[float]) -> None:
    t_floor, t_fs, t_ing = statistics.median(floor), statistics.median(fs), statistics.median(ing)
    rate = n / t_ing
    print(f"{label:10s} executemany floor {n / t_floor:7.0f} records/s | spool floor {n / t_fs:7.0f}/s | "
          f"runs: floor {', '.join(f'{n / t:.0f}' for t in floor)}; spool {', '.join(f'{n / t:.0f}' for t in fs)}")
    print(f"{'':10s} ingest, one process {rate:7.0f} records/s ({gpus / t_ing:6.0f} GPU rows/s) | ingest/floor time "
          f"{t_ing / t_floor:4.2f} | ingest/spool {t_ing / t_fs:4.2f} | goal >= {GOAL}/s: "
          f"{'met' if rate >= GOAL else 'NOT met'} | runs {', '.join(f'{n / t:.0f}' for t in ing)}")
    print(f"{'':10s} {BACKLOG:,} spooled records drain in {BACKLOG / rate / 60:.1f} min at this rate")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=10000)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measurement; medians are reported")
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    ap.add_argument("--no-postgres", action="store_true")
    a = ap.parse_args()
    recs = [synthetic.record(i + 1) for i in range(a.records)]
    gpus = sum(len(r["gpus"]) for r in recs)
    d = tempfile.mkdtemp(prefix="gpueff-bench-")
    print(f"{a.records} records ({gpus} job-GPU rows, {gpus / a.records:.1f} GPUs/record, 10 timeline points/GPU), "
          f"{a.repeat} runs each, {os.cpu_count()} CPUs, one ingest process")
    try:
        ing, floor, fs = [], [], []
        for _ in range(a.repeat):
            ing.append(ingest_once(f"sqlite:///{d}/ingest-{uuid.uuid4().hex[:6]}.db", d, recs))
            path = f"{d}/floor-{uuid.uuid4().hex[:6]}.db"
            make_engine(path).dispose()  # migrated schema
            floor.append(floor_sqlite(path, floor_rows(recs, text_times=True)))
            fs.append(spool_floor(d, recs))
        report("SQLite", a.records, gpus, ing, floor, fs)
        if not a.no_postgres:
            admin = a.postgres.replace("postgresql+psycopg", "postgresql") + "/postgres"
            created = _pg_databases(admin, 2 * a.repeat)
            names = list(created)
            try:
                ing, floor = [], []
                for _ in range(a.repeat):
                    ing.append(ingest_once(f"{a.postgres}/{names.pop()}", d, recs))
                    name = names.pop()
                    e = make_engine(f"{a.postgres}/{name}", create=False)
                    migrate.upgrade(e)
                    e.dispose()
                    floor.append(floor_pg(f"{a.postgres}/{name}", floor_rows(recs, text_times=False)))
                report("PostgreSQL", a.records, gpus, ing, floor, fs)
            finally:
                _drop(admin, created)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
