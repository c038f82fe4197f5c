#!/usr/bin/env python3
"""``seff-gpu JOBID`` on the 1 M-row database against ``python3 -c pass``, in the same run; with ``--api``,
also ``seff-gpu JOBID`` through ``gpueff serve``'s API against the direct read, in the same run.

    python3 bench/seff_latency.py [--db PATH] [--runs N] [--api]

Uses the database of bench/rollup_month.py (built there with --keep; built here if missing). Reports
the median wall time of N runs of each; ratio = seff-gpu / bare interpreter start.

``--api`` (as root, with MUNGE installed): starts a private ``munged`` (its own key and socket) and a
``gpueff serve`` whose API listens on a Unix socket (its scheduled tasks off), then times, alternating,
``seff-gpu JOBID`` reading the database itself and the same command made to ask the service
(``GPUEFF_SEFF_VIA=service``: a MUNGE credential, one HTTP request, the service's answer), and checks
that both print the same bytes. ratio = through the API / direct; the goal is <= 1 (the API answers
within the time seff-gpu takes today).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = "777777"


def wall(cmd: list[str], env: dict[str, str]) -> tuple[float, str]:
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    dt = time.perf_counter() - t
    if out.returncode != 0:
        raise SystemExit(f"{cmd} failed ({out.returncode}): {out.stderr.strip()}")
    return dt, out.stdout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--db", default="/tmp/gpueff-bench-1m.db")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--api", action="store_true", help="also through gpueff serve's API (root, MUNGE)")
    a = ap.parse_args()
    if not os.path.exists(a.db):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "rollup_month.py"), "--db", a.db, "--keep"],
                       check=True)
    tmp = tempfile.mkdtemp(prefix="seff-latency-")
    cfg = os.path.join(tmp, "gpueff.toml")
    with open(cfg, "w") as fh:
        fh.write(f'[paths]\ndatabase = "{a.db}"\nstate_dir = "/nonexistent"\n[privacy]\nenabled = false\n')
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("GPUEFF_SEFF_VIA", None)
    seff = [sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", cfg, JOB]
    bare = [sys.executable, "-c", "pass"]
    try:
        wall(seff, env)  # warm the page cache
        s_times, b_times = [], []
        for _ in range(a.runs):
            b_times.append(wall(bare, env)[0])
            s_times.append(wall(seff, env)[0])
        s, b = statistics.median(s_times), statistics.median(b_times)
        print(f"seff-gpu {JOB} on a 1 M-job database: {s * 1000:.0f} ms   python3 -c pass: {b * 1000:.0f} ms   "
              f"ratio {s / b:.1f}")
        if a.api:
            api(a, tmp, cfg, env, seff)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


def api(a: argparse.Namespace, tmp: str, cfg: str, env: dict[str, str], seff: list[str]) -> None:
    """Direct vs through the API, alternating, same run; both must print the same bytes."""
    key, sock, uds = f"{tmp}/munge.key", f"{tmp}/munge.sock", f"{tmp}/api.sock"
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    with open(cfg, "a") as fh:
        fh.write(f'[service]\napi_listen = "unix:{uds}"\nmunge_socket = "{sock}"\nmetrics_port = 0\n'
                 + "".join(f"{k} = 0\n" for k in ("ingest_interval_s", "enrich_interval_s", "rollup_interval_s",
                                                  "rollup_full_interval_s", "retention_interval_s",
                                                  "cards_interval_s")))
    munged = subprocess.Popen(["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                               f"--pid-file={tmp}/munged.pid", f"--log-file={tmp}/munged.log",
                               f"--seed-file={tmp}/munged.seed"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = open(f"{tmp}/serve.log", "w")  # noqa: SIM115 (closed below, after the service stops)
    serve = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", cfg, "serve"], env=env,
                             stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            if os.path.exists(uds) and os.path.exists(sock):
                break
            if serve.poll() is not None:
                raise SystemExit(f"gpueff serve exited {serve.returncode}: see {tmp}/serve.log")
            time.sleep(0.1)
        via = {**env, "GPUEFF_SEFF_VIA": "service"}
        d_out, v_out = wall(seff, env)[1], wall(seff, via)[1]  # warm both (the service's first request imports)
        if d_out != v_out:
            raise SystemExit("the service path printed other bytes than the direct path")
        d_times, v_times = [], []
        for _ in range(a.runs):
            d_times.append(wall(seff, env)[0])
            v_times.append(wall(seff, via)[0])
        d, v = statistics.median(d_times), statistics.median(v_times)
        print(f"seff-gpu {JOB} direct: {d * 1000:.0f} ms   through the API (MUNGE + HTTP on a Unix socket): "
              f"{v * 1000:.0f} ms   ratio {v / d:.2f}   (same bytes: yes; {a.runs} runs each, medians)")
    finally:
        serve.send_signal(signal.SIGTERM)
        serve.wait(60)
        log.close()
        munged.terminate()
        munged.wait(10)


if __name__ == "__main__":
    sys.exit(main())
