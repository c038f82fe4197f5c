#!/usr/bin/env python3
"""``seff-gpu JOBID`` on the 1 M-row database against ``python3 -c pass``, in the same run.

    python3 bench/seff_latency.py [--db PATH] [--runs N]

Uses the database of bench/rollup_month.py (built there with --keep; built here if missing). Reports
the median wall time of N runs of each; ratio = seff-gpu / bare interpreter start.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wall(cmd: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"{cmd} failed ({out.returncode}): {out.stderr.strip()}")
    return dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="/tmp/gpueff-bench-1m.db")
    ap.add_argument("--runs", type=int, default=7)
    a = ap.parse_args()
    if not os.path.exists(a.db):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "rollup_month.py"), "--db", a.db, "--keep"],
                       check=True)
    with tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False) as fh:
        fh.write(f'[paths]\ndatabase = "{a.db}"\nstate_dir = "/nonexistent"\n[privacy]\nenabled = false\n')
        cfg = fh.name
    env = {**os.environ, "PYTHONPATH": ROOT}
    job = "777777"
    seff = [sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", cfg, job]
    bare = [sys.executable, "-c", "pass"]
    wall(seff, env)  # warm the page cache
    s_times, b_times = [], []
    for _ in range(a.runs):
        b_times.append(wall(bare, env))
        s_times.append(wall(seff, env))
    s, b = statistics.median(s_times), statistics.median(b_times)
    print(f"seff-gpu {job} on a 1 M-job database: {s * 1000:.0f} ms   python3 -c pass: {b * 1000:.0f} ms   "
          f"ratio {s / b:.1f}")
    os.unlink(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
