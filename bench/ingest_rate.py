#!/usr/bin/env python3
"""Ingest rate (spool files -> database, `ingest_spool`) against a raw DBAPI `executemany` floor.

    python3 bench/ingest_rate.py [--records N] [--postgres URL | --no-postgres]

Records are slurm_gpueff.synthetic ones (1-8 GPUs, mean ~3.2; 10 timeline points per GPU; a fifth
pre-Hopper). The floor inserts the same rows (job, job_gpu, timeline, JSON included) from memory with
one executemany per table and one commit: no files, no validation, no merge. Both run in this process,
one after the other, so the ratio is meaningful on a noisy machine. Goals: >= 20k records/s SQLite,
>= 5k/s PostgreSQL.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from slurm_gpueff import spool, synthetic  # noqa: E402
from slurm_gpueff.storage import migrate  # noqa: E402
from slurm_gpueff.storage.db import make_engine  # noqa: E402
from slurm_gpueff.storage.ingest import ingest_spool  # noqa: E402

JOB_COLS = ("cluster", "job_id", "user", "account", "partition", "gpu_count", "start_time", "end_time", "elapsed_s",
            "state", "exit_code", "signal", "backend", "record_source", "enriched", "nodelist", "gpu_type",
            "ingested_at")
GPU_COLS = ("job_pk", "node", "gpu_index", "minor", "uuid", "pci_bus_id", "model", "memory_total_bytes",
            "kernel_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active",
            "fp32_active", "fp16_active", "memory_used_peak_bytes", "energy_j", "power_mean_w", "source", "samples",
            "missing")


def floor_rows(recs):  # noqa: ANN001, ANN201
    from datetime import UTC, datetime

    def ts(x):  # noqa: ANN001, ANN202
        return datetime.fromtimestamp(x, UTC).replace(tzinfo=None)

    jobs, gpus, tls = [], [], []
    for pk, r in enumerate(recs, 1):
        jobs.append((r["cluster"], r["job_id"], r["user"], r["account"], r["partition"], len(r["gpus"]),
                     ts(r["start_time"]), ts(r["end_time"]), r["end_time"] - r["start_time"], "COMPLETED",
                     r["exit_code"], r["signal"], r["backend"], "hook", False, r["node"], "Synthetic H100",
                     ts(r["end_time"])))
        for g in r["gpus"]:
            gpus.append((pk, r["node"], g["index"], g["minor"], g["uuid"], g["pci_bus_id"], g["model"],
                         g["memory_total_bytes"], *[g[k] for k in GPU_COLS[8:19]], g["source"], g["samples"],
                         json.dumps(g["missing"])))
            tls.append((len(gpus), json.dumps(g["timeline"])))
    return jobs, gpus, tls


def floor_sqlite(path: str, recs) -> float:  # noqa: ANN001
    import sqlite3

    engine = make_engine(path)  # migrated schema
    engine.dispose()
    t0 = time.perf_counter()
    jobs, gpus, tls = floor_rows(recs)
    con = sqlite3.connect(path)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.executemany(f"INSERT INTO job ({','.join(JOB_COLS)}) VALUES ({','.join('?' * len(JOB_COLS))})",
                    [tuple(str(v) if hasattr(v, 'isoformat') else v for v in j) for j in jobs])
    con.executemany(f"INSERT INTO job_gpu ({','.join(GPU_COLS)}) VALUES ({','.join('?' * len(GPU_COLS))})", gpus)
    con.executemany("INSERT INTO job_gpu_timeline (job_gpu_id, points) VALUES (?, ?)", tls)
    con.commit()
    con.close()
    return time.perf_counter() - t0


def floor_pg(url: str, recs) -> float:  # noqa: ANN001
    import psycopg

    t0 = time.perf_counter()
    jobs, gpus, tls = floor_rows(recs)
    with psycopg.connect(url.replace("postgresql+psycopg", "postgresql")) as con, con.cursor() as cur:
        cols = ",".join('"user"' if c == "user" else c for c in JOB_COLS)
        cur.executemany(f'INSERT INTO job ({cols}) '
                        f'VALUES ({",".join(["%s"] * len(JOB_COLS))}) RETURNING id', jobs, returning=True)
        ids = []
        while True:
            ids.append(cur.fetchone()[0])
            if not cur.nextset():
                break
        gpus = [(ids[g[0] - 1], *g[1:]) for g in gpus]
        cur.executemany(f"INSERT INTO job_gpu ({','.join(GPU_COLS)}) VALUES ({','.join(['%s'] * len(GPU_COLS))}) "
                        "RETURNING id", gpus, returning=True)
        gids = []
        while True:
            gids.append(cur.fetchone()[0])
            if not cur.nextset():
                break
        cur.executemany("INSERT INTO job_gpu_timeline (job_gpu_id, points) VALUES (%s, %s)",
                        [(gids[i], t[1]) for i, t in enumerate(tls)])
    return time.perf_counter() - t0


def ingest_once(url: str, d: str, recs) -> float:  # noqa: ANN001
    sp = os.path.join(d, "spool-" + uuid.uuid4().hex[:6])
    for r in recs:
        spool.write_record(sp, r)
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    t0 = time.perf_counter()
    res = ingest_spool(engine, sp)
    dt = time.perf_counter() - t0
    assert res.ingested == len(recs) and not res.failed, res.errors[:3]
    engine.dispose()
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=5000)
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432")
    ap.add_argument("--no-postgres", action="store_true")
    a = ap.parse_args()
    recs = [synthetic.record(i + 1) for i in range(a.records)]
    gpus = sum(len(r["gpus"]) for r in recs)
    d = tempfile.mkdtemp(prefix="gpueff-bench-")
    print(f"{a.records} records ({gpus} job-GPU rows, {gpus / a.records:.1f} GPUs/record, 10 timeline points/GPU)")
    try:
        t_ing = ingest_once(f"sqlite:///{d}/ingest.db", d, recs)
        t_floor = floor_sqlite(f"{d}/floor.db", recs)
        print(f"SQLite     ingest {a.records / t_ing:8.0f} records/s ({gpus / t_ing:7.0f} GPU rows/s)   "
              f"executemany floor {a.records / t_floor:8.0f} records/s   ingest/floor time ratio {t_ing / t_floor:5.2f}"
              f"   goal >= 20000/s: {'met' if a.records / t_ing >= 20000 else 'NOT met'}")
        if not a.no_postgres:
            import psycopg

            admin = a.postgres.replace("postgresql+psycopg", "postgresql") + "/postgres"
            names = [f"gpueff_bench_{uuid.uuid4().hex[:8]}" for _ in range(2)]
            with psycopg.connect(admin, autocommit=True) as c:
                for n in names:
                    c.execute(f'CREATE DATABASE "{n}"')
            try:
                t_ing = ingest_once(f"{a.postgres}/{names[0]}", d, recs)
                e = make_engine(f"{a.postgres}/{names[1]}", create=False)
                migrate.upgrade(e)
                e.dispose()
                t_floor = floor_pg(f"{a.postgres}/{names[1]}", recs)
                print(f"PostgreSQL ingest {a.records / t_ing:8.0f} records/s ({gpus / t_ing:7.0f} GPU rows/s)   "
                      f"executemany floor {a.records / t_floor:8.0f} records/s   ingest/floor time ratio "
                      f"{t_ing / t_floor:5.2f}   goal >= 5000/s: {'met' if a.records / t_ing >= 5000 else 'NOT met'}")
            finally:
                with psycopg.connect(admin, autocommit=True) as c:
                    for n in names:
                        c.execute(f'DROP DATABASE IF EXISTS "{n}" WITH (FORCE)')
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
