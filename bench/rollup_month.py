#!/usr/bin/env python3
"""Monthly rollup over 1 M synthetic job-GPU rows (SQLite) against the bare SQL GROUP BY.

    python3 bench/rollup_month.py [--rows 1000000] [--order ingest|random] [--db PATH] [--keep]

Builds (or reuses: an existing ``--db`` is used as it is) a database with one month of finished,
analysed jobs: ``--rows`` job rows of one GPU each (the worst case for the rollup: one job per job-GPU
row) plus their ``job_gpu`` rows. Times ``rollups.refresh_month`` (day rows by
cluster/user/account/verdict, then the month rows) against one bare ``SELECT ... GROUP BY user, account,
verdict`` over the same month, in the same run. Goal: month <= 5 s. ``--keep`` leaves the database for
bench/seff_latency.py.

``--order``: the physical order of the rows. ``ingest`` (default): ids grow with the end time, as ingest
writes jobs shortly after they end, so the month's range of the end-time index reads the table nearly
in order. ``random``: ids unrelated to end times (a bulk backfill of old jobs, say); each row the index
finds is then a random page, which on a 2-CPU VM made both the rollup and the bare GROUP BY about twice
as slow (4.44 and 3.06 s, against 2.19 and 1.34 s in ingest order).
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import sys
import time
from datetime import date, datetime, timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package, and the synthetic records of the tests

import synthetic  # noqa: E402
from sqlalchemy import text  # noqa: E402

from slurm_gpueff.models import utcnow  # noqa: E402
from slurm_gpueff.storage import rollups  # noqa: E402
from slurm_gpueff.storage.db import make_engine  # noqa: E402

MONTH = date(2024, 5, 1)
DEFAULT_DB = {"ingest": "/tmp/gpueff-bench-1m.db", "random": "/tmp/gpueff-bench-1m-random.db"}


def build(path: str, n: int, order: str = "ingest") -> None:
    make_engine(path).dispose()  # migrated schema
    rng = random.Random(1)
    con = sqlite3.connect(path)
    t0 = datetime(2024, 5, 1)
    jobs, gpus = [], []
    fmt = "%Y-%m-%d %H:%M:%S.%f"
    ends = [rng.uniform(0, 31 * 86400 - 1) for _ in range(n)]
    if order == "ingest":
        ends.sort()
    for i in range(1, n + 1):
        end = t0 + timedelta(seconds=ends[i - 1])
        dur = rng.uniform(300, 36000)
        gh = dur / 3600
        k = rng.random()
        s = None if rng.random() < 0.2 else k * rng.random()
        t = None if s is None else s * rng.random()
        verdict = rng.choice(synthetic.VERDICTS)
        u = rng.randrange(len(synthetic.USERS))  # a user works in one account (most do)
        jobs.append((i, "bench", i, synthetic.USERS[u], synthetic.ACCOUNTS[u % len(synthetic.ACCOUNTS)], "gpu", 1,
                     (end - timedelta(seconds=dur)).strftime(fmt), end.strftime(fmt), dur, "COMPLETED", 0, 0,
                     "simulated", "hook", 0, f"gpu{i % 500:03d}", "Synthetic H100", end.strftime(fmt), gh,
                     gh * (1 - k), None if s is None else gh * (k - s), None if s is None else gh * s,
                     None if t is None else gh * t, k, s, t, dur * 400.0, verdict, verdict.replace("_", " "),
                     end.strftime(fmt)))
        gpus.append((i, i, f"gpu{i % 500:03d}", 0, 0, f"GPU-{i}", "Synthetic H100", 80 * 2**30,
                     end.strftime(fmt), k, s, t, dur * 400.0, "simulated", int(dur / 5), "{}"))
    con.executemany("INSERT INTO job (id, cluster, job_id, user, account, partition, gpu_count, start_time, "
                    "end_time, elapsed_s, state, exit_code, signal, backend, record_source, enriched, nodelist, "
                    "gpu_type, ingested_at, gpu_hours, idle_gpu_hours, underfilled_gpu_hours, sm_active_gpu_hours, "
                    "tensor_active_gpu_hours, kernel_active, sm_active, tensor_active, energy_j, verdict, "
                    "verdict_title, analyzed_at) VALUES (" + ",".join("?" * 31) + ")", jobs)
    con.executemany("INSERT INTO job_gpu (id, job_pk, node, gpu_index, minor, uuid, model, memory_total_bytes, "
                    "end_time, kernel_active, sm_active, tensor_active, energy_j, source, samples, missing) "
                    "VALUES (" + ",".join("?" * 16) + ")", gpus)
    con.commit()
    con.execute("ANALYZE")
    con.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--order", choices=sorted(DEFAULT_DB), default="ingest",
                    help="physical order of the built rows (see above; default: ingest)")
    ap.add_argument("--db", help="database to build or reuse (default: /tmp/gpueff-bench-1m[-random].db)")
    ap.add_argument("--keep", action="store_true")
    a = ap.parse_args()
    a.db = a.db or DEFAULT_DB[a.order]
    fresh = not os.path.exists(a.db)
    if fresh:
        t = time.perf_counter()
        build(a.db, a.rows, a.order)
        print(f"built {a.db}: {a.rows} jobs / job-GPU rows in one month, ids in {a.order} order "
              f"({time.perf_counter() - t:.0f} s)")
    else:
        print(f"reusing {a.db} as it is")
    engine = make_engine(a.db)
    m0, m1 = "2024-05-01 00:00:00.000000", "2024-06-01 00:00:00.000000"
    bare = text("SELECT user, account, verdict, count(*), sum(gpu_hours), sum(idle_gpu_hours), "
                "sum(underfilled_gpu_hours), sum(sm_active_gpu_hours), sum(tensor_active_gpu_hours), sum(energy_j) "
                "FROM job WHERE end_time >= :a AND end_time < :b GROUP BY user, account, verdict")
    best_bare = best_roll = float("inf")
    for _ in range(3):
        with engine.connect() as conn:
            t = time.perf_counter()
            n_groups = len(conn.execute(bare, {"a": m0, "b": m1}).all())
            best_bare = min(best_bare, time.perf_counter() - t)
        t = time.perf_counter()
        with engine.begin() as conn:
            rows = rollups.refresh_month(conn, MONTH, utcnow())
        best_roll = min(best_roll, time.perf_counter() - t)
    with engine.connect() as conn:
        t = time.perf_counter()
        users = rollups.usage(conn, period="month", by="user", start=MONTH)
        q = time.perf_counter() - t
        jobs = conn.execute(text("SELECT count(*) FROM job WHERE end_time >= :a AND end_time < :b"),
                            {"a": m0, "b": m1}).scalar()
    print(f"month of {jobs} job-GPU rows: rollup refresh {best_roll:.2f} s ({rows} rollup rows)   bare GROUP BY "
          f"{best_bare:.2f} s ({n_groups} groups)   ratio {best_roll / best_bare:.2f}   goal <= 5 s: "
          f"{'met' if best_roll <= 5 else 'NOT met'}")
    print(f"per-user monthly query on the rollups: {q * 1000:.1f} ms ({len(users)} users)")
    engine.dispose()
    if not a.keep and fresh:
        os.unlink(a.db)
    return 0


if __name__ == "__main__":
    sys.exit(main())
