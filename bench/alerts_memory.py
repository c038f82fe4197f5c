#!/usr/bin/env python3
"""One idle-alert pass at a large site's size, for its memory: 25,000 running jobs, 85,000 GPUs, 14 stored
samples a GPU (one ``[alerts] window_min`` of live records every five minutes, and the one before it), in a
fresh process, against a baseline measured in the same run: the same samples read at once as plain rows
(what the pass held before it read them one GPU at a time).

    python3 bench/alerts_memory.py [--postgres URL] [--runs N]

The database (``gpueff_alerts_memory`` on the server of ``--postgres``, default the local one) is made
anew for each run, so every pass starts from the same samples; ``squeue`` answers nothing running, so the
pass reads, stores and prunes the samples (what holds memory) and judges no job. Prints each run's peak RSS
(ru_maxrss) and wall time, and ratio = the pass's peak RSS / the baseline's. What it does not cover: the
service's other memory (its threads, the chart process) and the ORM rows of the running jobs beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DB = "gpueff_alerts_memory"

BUILD = [
    "INSERT INTO job (id, cluster, job_id, run, gpu_count, backend, record_source, enriched, \"user\", account, "
    "state, start_time, end_time) SELECT i, 'c', 10000000 + i, 0, 4, 'nvml', 'live', false, 'u' || (i % 5000), "
    "'a' || (i % 500), 'RUNNING', now() - interval '5 hours', now() - interval '1 minute' "
    "FROM generate_series(1, 25000) i",
    "INSERT INTO job_gpu (job_pk, node, gpu_index, source, samples, measured_s, kernel_active, sm_active, "
    "start_time, end_time) SELECT i, 'gpu-node-' || lpad((i % 6250)::text, 5, '0'), g, 'nvml', 100, 18000, 0.5, "
    "0.3, now() - interval '5 hours', now() - interval '1 minute' FROM generate_series(1, 25000) i, "
    "generate_series(0, 3) g WHERE i % 5 <> 0 OR g < 1",
    "INSERT INTO live_sample (job_pk, node, gpu_index, as_of, covered_s, kernel_s, sm_s) SELECT g.job_pk, g.node, "
    "g.gpu_index, now() - interval '1 minute' - k * interval '5 minutes', 18000 - 300 * k, (18000 - 300 * k) * 0.5, "
    "(18000 - 300 * k) * 0.3 FROM job_gpu g, generate_series(1, 14) k",
    "ANALYZE",
]

CHILD = r"""
import json, resource, sys, time
from sqlalchemy import text
from slurm_gpueff.config import Config
from slurm_gpueff.storage.db import make_engine
eng = make_engine(sys.argv[2], create=False)
with eng.connect() as c:
    c.execute(text("SELECT 1"))
t = time.perf_counter()
if sys.argv[1] == "pass":
    from slurm_gpueff.service.alerts import run_alerts
    res = run_alerts(eng, Config({"alerts": {"enabled": True, "dry_run": True}}), squeue=lambda ids: {})
    said = str(res)[:80]
else:  # the baseline: the same samples read at once, as plain rows
    with eng.connect() as c:
        rows = c.execute(text("SELECT * FROM live_sample")).fetchall()
    said = f"{len(rows):,} rows"
print(json.dumps({"s": time.perf_counter() - t, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "said": said}))
"""


def admin(server: str, sql: str) -> None:
    subprocess.run(["psql", server.replace("postgresql+psycopg://", "postgresql://"), "-qAtc", sql], check=True)


def build(server: str) -> str:
    from sqlalchemy import text

    from slurm_gpueff.storage import migrate
    from slurm_gpueff.storage.db import make_engine

    admin(server, f"DROP DATABASE IF EXISTS {DB}")
    admin(server, f"CREATE DATABASE {DB}")
    url = server.rsplit("/", 1)[0] + "/" + DB
    eng = make_engine(url, create=False)
    migrate.upgrade(eng)
    with eng.begin() as c:
        for sql in BUILD:
            c.execute(text(sql))
        n = c.execute(text("SELECT count(*) FROM live_sample")).scalar()
    eng.dispose()
    print(f"built: 25,000 running jobs, {n:,} stored samples")
    return url


def child(kind: str, url: str) -> dict[str, float | str]:
    out = subprocess.run([sys.executable, "-c", CHILD, kind, url], capture_output=True, text=True, check=True,
                         cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    passes, floors = [], []
    for k in range(a.runs):
        url = build(a.postgres)
        floor = child("baseline", url)
        t0 = time.perf_counter()
        run = child("pass", url)
        print(f"run {k + 1}: the pass peak {run['peak_mb']:.0f} MB in {run['s']:.1f} s ({run['said']}); "
              f"baseline: the samples read at once peak {floor['peak_mb']:.0f} MB in {floor['s']:.1f} s "
              f"({floor['said']}); "
              f"ratio {float(run['peak_mb']) / float(floor['peak_mb']):.2f} (wall {time.perf_counter() - t0:.1f} s)")
        passes.append(float(run["peak_mb"]))
        floors.append(float(floor["peak_mb"]))
    passes.sort()
    floors.sort()
    print(f"the pass's peak RSS min / median / max: {passes[0]:.0f} / {passes[len(passes) // 2]:.0f} / "
          f"{passes[-1]:.0f} MB; the baseline's {floors[0]:.0f} / {floors[len(floors) // 2]:.0f} / {floors[-1]:.0f} MB")
    admin(a.postgres, f"DROP DATABASE IF EXISTS {DB}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
