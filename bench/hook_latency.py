#!/usr/bin/env python3
"""Hook latency: what the Prolog and Epilog add to every job start and end, against ``python3 -c pass``.

Runs the real hooks (``hooks/prolog`` then ``hooks/epilog`` for one job, as subprocesses with a
slurmd-like environment: no PATH, no HOME, cwd elsewhere) against a temporary spool, for the simulated
backend and the allocation-only backend (``none``), interleaved with ``python3 -c pass`` run by the
same interpreter, so the ratio is measured in one run on one machine state. Goal: median hook <= 1.5x
the median baseline.

    python3 bench/hook_latency.py [-n 30] [--python /usr/bin/python3] [--check]

``--python`` chooses the interpreter for both hooks and baseline (default: this one; slurmd would use
the hooks' shebang, ``/usr/bin/python3``). ``--check`` exits 1 when the goal is missed.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOAL = 1.5


def _timed(cmd: list[str], env: dict[str, str], cwd: str) -> float:
    t = time.perf_counter()
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    dt = time.perf_counter() - t
    if p.returncode != 0 or p.stderr:
        raise SystemExit(f"{' '.join(cmd)} failed (rc {p.returncode}): {p.stderr.decode()[-2000:]}")
    return dt


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    n, python, check = 30, sys.executable, False
    while args:
        a = args.pop(0)
        if a == "-n":
            n = int(args.pop(0))
        elif a == "--python":
            python = args.pop(0)
        elif a == "--check":
            check = True
        else:
            print(__doc__)
            return 2
    work = tempfile.mkdtemp(prefix="gpueff-bench-")
    backends = ("simulated", "none")
    configs = {}
    for b in backends:
        path = os.path.join(work, f"{b}.toml")
        with open(path, "w") as fh:
            fh.write(f'[paths]\nspool_dir = "{work}/spool-{b}"\nstate_dir = "{work}/state-{b}"\n'
                     f'[collector]\nbackend = "{b}"\n')
        configs[b] = path
    base_env = {"SLURMD_NODENAME": "node01", "SLURM_CLUSTER_NAME": "bench", "SLURM_JOB_USER": "alice",
                "SLURM_JOB_UID": "1000", "SLURM_JOB_PARTITION": "gpu", "SLURM_JOB_GPUS": "0,1",
                "CUDA_VISIBLE_DEVICES": "0,1"}
    times: dict[str, list[float]] = {"baseline": []}
    for b in backends:
        times[f"prolog/{b}"] = []
        times[f"epilog/{b}"] = []
    prolog, epilog = os.path.join(ROOT, "hooks", "prolog"), os.path.join(ROOT, "hooks", "epilog")
    baseline = [python, "-c", "pass"]
    for cmd in ([python, prolog], baseline):  # warm the page cache and the .pyc files
        _timed(cmd, {**base_env, "SLURM_JOB_ID": "1", "GPUEFF_CONFIG": configs["none"]}, work)
    job = 100
    for _ in range(n):
        for b in backends:
            job += 1
            env = {**base_env, "SLURM_JOB_ID": str(job), "GPUEFF_CONFIG": configs[b]}
            times["baseline"].append(_timed(baseline, env, work))
            times[f"prolog/{b}"].append(_timed([python, prolog], env, work))
            times["baseline"].append(_timed(baseline, env, work))
            end_env = {**env, "SLURM_JOB_EXIT_CODE2": "0:0"}
            times[f"epilog/{b}"].append(_timed([python, epilog], end_env, work))
    records = sum(len(os.listdir(os.path.join(work, f"spool-{b}", "incoming"))) for b in backends)
    expected = n * len(backends)
    base = statistics.median(times["baseline"])
    print(f"interpreter: {python}  runs: {n} per hook and backend, {len(times['baseline'])} baseline")
    print(f"{'what':<18}{'median ms':>10}{'p90 ms':>9}{'ratio':>8}")
    worst = 0.0
    for name, ts in times.items():
        med = statistics.median(ts)
        p90 = sorted(ts)[int(0.9 * (len(ts) - 1))]
        ratio = med / base
        if name != "baseline":
            worst = max(worst, ratio)
        print(f"{name:<18}{med * 1000:>10.1f}{p90 * 1000:>9.1f}{ratio:>8.2f}")
    ok = worst <= GOAL
    print(f"worst hook/baseline ratio {worst:.2f}: goal <= {GOAL} {'met' if ok else 'NOT met'}; "
          f"{records} records spooled (expected {expected})")
    shutil.rmtree(work, ignore_errors=True)
    if records != expected:
        print("error: not every Epilog wrote its record")
        return 1
    return 0 if ok or not check else 1


if __name__ == "__main__":
    sys.exit(main())
