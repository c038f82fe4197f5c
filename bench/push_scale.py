#!/usr/bin/env python3
"""Push at site scale: NODES simulated GPU nodes on this machine, each running the real forwarder loop
(node/push.py ``run_forwarder``, every ``[service] forward_interval_s``, default 15 s) on its own spool,
into one ``gpueff serve`` on loopback (a private munged; PostgreSQL), while jobs end at RATE records/s
spread over the nodes at random, for SECONDS.

Ingest lag is, per record, the time from its file landing in a node's spool to its row appearing in the
database (polled every 0.25 s). Printed: lag p50/p99/max; the service's CPU (seconds, and share of one
core) and RSS (now and peak) over the run; the simulated nodes' CPU for comparison. Baseline, in the same
run: the same number of the same records ingested by ``gpueff ingest`` from one spool into the same
database (the shared-spool layout, no HTTP, no MUNGE); ratio = the service's CPU per pushed record / the
ingest's CPU per record.

    python3 bench/push_scale.py [--nodes 2000] [--rate 40] [--seconds 600] [--procs 4] [--postgres URL]

The nodes run as threads in ``--procs`` processes (a node's forwarder is one thread that sleeps between
passes), so one machine holds thousands. Root and MUNGE needed.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"), os.path.join(_ROOT, "bench")]  # synthetic, pushsite

import synthetic  # noqa: E402
from pushsite import answered, cpu_s, fresh_pg, node_name, pending, rss_mb, run_nodes, start_site  # noqa: E402

from slurm_gpueff import spool  # noqa: E402


def baseline(base: str, url: str, n: int) -> float:
    """CPU seconds per record of ``gpueff ingest`` taking ``n`` records like the pushed ones from a spool."""
    import resource

    d = os.path.join(base, "baseline")
    spool_dir = os.path.join(d, "spool")
    for seq in range(1, n + 1):
        spool.write_record(spool_dir, synthetic.record(seq, cluster="baseline", node=node_name(seq % 2000), gpus=1,
                                                       timeline_points=60))
    cfg = os.path.join(d, "gpueff.toml")
    with open(cfg, "w") as fh:
        fh.write(f'[site]\ncluster = "baseline"\n[paths]\nspool_dir = "{spool_dir}"\nstate_dir = "{d}/run"\n'
                 f'database = "{url}"\n')
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", cfg, "ingest", "--quiet"],
                   cwd=_ROOT, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=2000)
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--interval", type=float, default=15.0, help="[service] forward_interval_s (default 15)")
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--keep", action="store_true", help="keep the site's directory (logs, spools)")
    a = ap.parse_args()
    from sqlalchemy import create_engine, text

    from slurm_gpueff.storage import migrate
    from slurm_gpueff.storage.db import make_engine

    url = fresh_pg(a.postgres, "gpueff_push_scale")
    migrate.upgrade(make_engine(url, create=False))
    base = tempfile.mkdtemp(prefix="gpueff-push-scale-", dir="/tmp")
    site, munged = start_site(base, url, forward_interval_s=a.interval, max_backoff_s=120.0)
    pid = site.start()
    service = {"api_url": f"http://127.0.0.1:{site.port}", "munge_socket": site.sock,
               "forward_interval_s": a.interval, "forward_max_backoff_s": 120.0}
    for i in range(a.nodes):
        spool.ensure_dirs(os.path.join(base, "nodes", node_name(i), "spool"))
    stop = mp.Event()
    per = -(-a.nodes // a.procs)
    workers = [mp.Process(target=run_nodes, args=(f, min(per, a.nodes - f), base, service, stop, "bench"))
               for f in range(0, a.nodes, per)]
    for w in workers:
        w.start()
    time.sleep(a.interval + 2)  # every node up
    print(f"{a.nodes} nodes up in {len(workers)} processes; service pid {pid}; {a.rate:g} records/s for "
          f"{a.seconds:g} s; forward_interval_s {a.interval:g}", flush=True)

    written: dict[int, float] = {}
    seen: dict[int, float] = {}
    eng = create_engine(url)
    done = threading.Event()

    def watch() -> None:
        last = 0
        while not done.is_set() or len(seen) < len(written):
            with eng.connect() as c:
                rows = c.execute(text("SELECT id, job_id FROM job WHERE id > :last ORDER BY id"), {"last": last}).all()
            now = time.time()
            for pk, job in rows:
                seen.setdefault(job, now)
                last = max(last, pk)
            if done.is_set() and time.time() > end_wait:
                return
            time.sleep(0.25)

    end_wait = float("inf")
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    cpu0, t0 = cpu_s(pid), time.time()
    nodes_cpu0 = sum(cpu_s(w.pid) for w in workers if w.pid)
    rng = random.Random(1)
    seq, next_at = 0, time.time()
    while time.time() - t0 < a.seconds:
        seq += 1
        node = rng.randrange(a.nodes)
        d = os.path.join(base, "nodes", node_name(node), "spool")
        spool.write_record(d, synthetic.record(seq, cluster="bench", node=node_name(node), gpus=1, timeline_points=60))
        written[seq] = time.time()
        next_at += 1.0 / a.rate
        time.sleep(max(0.0, next_at - time.time()))
        if seq % int(a.rate * 60) == 0:  # the minute before last: its records have had a minute to arrive
            lo, hi = seq - 2 * int(a.rate * 60), seq - int(a.rate * 60)
            lags = sorted(seen[j] - written[j] for j in range(max(1, lo), hi) if j in seen)
            print(f"[{time.time() - t0:5.0f} s] written {seq}, stored {len(seen)}; records of the minute before "
                  f"last: lag p50 {lags[len(lags) // 2] if lags else float('nan'):.1f} s, p99 "
                  f"{lags[int(0.99 * (len(lags) - 1))] if lags else float('nan'):.1f} s; service RSS "
                  f"{rss_mb(pid):.0f} MB, CPU {cpu_s(pid) - cpu0:.0f} s", flush=True)
    gen_s = time.time() - t0
    cpu1 = cpu_s(pid)
    nodes_cpu1 = sum(cpu_s(w.pid) for w in workers if w.pid)
    rss_now, rss_peak = rss_mb(pid), rss_mb(pid, "VmHWM")
    end_wait = time.time() + 3 * a.interval + 60
    done.set()
    watcher.join()
    stop.set()
    for w in workers:
        w.join(120)
    lags = sorted(seen[j] - written[j] for j in written if j in seen)
    missing = len(written) - len(lags)
    left = sum(pending(os.path.join(base, "nodes", node_name(i), "spool")) for i in range(a.nodes))
    q = lambda p: lags[min(len(lags) - 1, int(p * (len(lags) - 1)))]  # noqa: E731
    print(f"written {len(written)} records in {gen_s:.0f} s ({len(written) / gen_s:.1f}/s) to {a.nodes} nodes; "
          f"stored {len(lags)}; not stored {missing} (left in spools {left})")
    print(f"ingest lag: p50 {q(0.5):.1f} s, p99 {q(0.99):.1f} s, max {lags[-1]:.1f} s, "
          f"mean {statistics.mean(lags):.1f} s")
    print(f"service: CPU {cpu1 - cpu0:.1f} s over {gen_s:.0f} s = {100 * (cpu1 - cpu0) / gen_s:.1f} % of one core "
          f"(pushes, unmunge, PostgreSQL client; PostgreSQL's own server not counted); RSS {rss_now:.0f} MB, "
          f"peak {rss_peak:.0f} MB")
    print(f"simulated nodes ({a.nodes} forwarders in {len(workers)} processes): CPU {nodes_cpu1 - nodes_cpu0:.1f} s "
          f"= {1000 * (nodes_cpu1 - nodes_cpu0) / gen_s / a.nodes:.2f} ms per node per second")
    log = Path(site.log).read_text()
    ms = sorted(int(m) for m in re.findall(r"records, stored .* -> 200 in (\d+) ms", log))
    print(f"service log: {answered(log, 200)} pushes answered 200, {answered(log, 503)} 503, "
          f"{answered(log, 401)} 401, {answered(log, 500)} 500; push handling p50 {ms[len(ms) // 2]} ms, "
          f"p99 {ms[int(0.99 * (len(ms) - 1))]} ms, max {ms[-1]} ms")
    for line in re.findall(r".*task \w+: .*", log)[-6:]:
        print("service task:", line)
    site.kill(signal.SIGTERM)
    munged.kill()
    base_cpu = baseline(base, url, len(written))
    push_cpu = (cpu1 - cpu0) / max(1, len(lags))
    print(f"baseline: gpueff ingest of {len(written)} such records from one spool: {base_cpu * 1000:.2f} ms CPU per "
          f"record; the service while pushed: {push_cpu * 1000:.2f} ms per record; ratio {push_cpu / base_cpu:.2f}")
    eng.dispose()
    if a.keep:
        print(f"kept {base}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0 if missing == 0 and q(0.99) < 60 else 1


if __name__ == "__main__":
    sys.exit(main())
