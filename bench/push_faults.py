#!/usr/bin/env python3
"""Push under faults: RECORDS records from NODES simulated GPU nodes, each with its own spool and its own
``gpueff forward`` process, into one ``gpueff serve`` on loopback (a private munged; PostgreSQL), while:

1. the service is killed (``kill -9``) mid-batch and started again at once;
2. a forwarder is killed (``kill -9``) mid-send and started again;
3. the service is down for DOWN_S seconds (``kill -9``), while more jobs end on the nodes (the last fifth of
   the records is written into the spools during the outage);
4. the service comes back and the nodes drain.

Then it counts by key in the database: rows of job_gpu, distinct (cluster, job id, node, GPU index), and
jobs, against the records written (one GPU each). Lost = written - distinct; duplicated = rows - distinct.

    python3 bench/push_faults.py [--records 20000] [--nodes 4] [--down-s 600] [--postgres URL]

Root and MUNGE needed. The forwarders pass every ``--interval`` seconds and back off up to ``--backoff``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"), os.path.join(_ROOT, "bench")]  # synthetic, pushsite

import synthetic  # noqa: E402
from pushsite import ROOT, answered, fresh_pg, pending, start_site  # noqa: E402

from slurm_gpueff import spool  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=20000)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--down-s", type=float, default=600.0)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--backoff", type=float, default=120.0)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    a = ap.parse_args()
    from sqlalchemy import create_engine, text

    from slurm_gpueff.storage import migrate
    from slurm_gpueff.storage.db import make_engine

    url = fresh_pg(a.postgres, "gpueff_push_faults")
    migrate.upgrade(make_engine(url, create=False))
    base = tempfile.mkdtemp(prefix="gpueff-push-faults-", dir="/tmp")
    site, munged = start_site(base, url, forward_interval_s=a.interval, max_backoff_s=a.backoff)
    nodes = [site.node(f"gpu{i:03d}") for i in range(a.nodes)]
    per_node = a.records // a.nodes
    early = per_node * 4 // 5
    t0 = time.monotonic()

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - t0:7.1f} s] {msg}", flush=True)

    def write(i: int, lo: int, hi: int) -> None:
        for j in range(lo, hi):
            spool.write_record(nodes[i][1], synthetic.record(1_000_000 * (i + 1) + j, cluster="bench",
                                                             node=f"gpu{i:03d}", gpus=1, timeline_points=2))

    for i in range(a.nodes):
        write(i, 0, early)
    written = early * a.nodes
    say(f"{written} records in {a.nodes} node spools; forwarders every {a.interval:g} s (backoff to {a.backoff:g} s), "
        f"batches of {a.batch}")
    site.start()
    logs = [os.path.join(base, f"forward-{i}.log") for i in range(a.nodes)]

    def forwarder(i: int) -> subprocess.Popen:
        with open(logs[i], "a") as fh:
            return subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", nodes[i][0],
                                     "forward", "--batch", str(a.batch)], cwd=ROOT, stdout=fh,
                                    stderr=subprocess.STDOUT)

    fwd = [forwarder(i) for i in range(a.nodes)]
    eng = create_engine(url)

    def stored() -> int:
        with eng.connect() as c:
            return int(c.execute(text("SELECT count(*) FROM job_gpu")).scalar_one())

    def left() -> int:
        return sum(pending(s) for _c, s in nodes)

    def until(cond, what: str, timeout: float = 1800) -> None:
        deadline = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > deadline:
                raise SystemExit(f"timed out waiting for {what}: {left()} left in the spools")
            time.sleep(0.005)

    # 1. kill -9 of the service while the nodes push
    until(lambda: left() < written * 3 // 4, "the first pushes")
    site.kill()
    say(f"kill -9 gpueff serve: {left()} left in the spools, {stored()} rows stored")
    site.start()
    say("gpueff serve started again")
    # 2. kill -9 of a forwarder mid-send
    until(lambda: left() < written // 2, "pushes after the restart")
    victim = random.randrange(a.nodes)
    fwd[victim].send_signal(signal.SIGKILL)
    fwd[victim].wait()
    say(f"kill -9 gpueff forward on gpu{victim:03d} ({pending(nodes[victim][1])} left in its spool); started again")
    fwd[victim] = forwarder(victim)
    # 3. the service down for down_s while more jobs end
    until(lambda: left() < written // 4, "pushes after the forwarder restart")
    site.kill()
    say(f"kill -9 gpueff serve: down for {a.down_s:g} s; {left()} left, {stored()} rows stored")
    down_at = time.monotonic()
    for i in range(a.nodes):
        write(i, early, per_node)
    written = per_node * a.nodes
    say(f"{written - early * a.nodes} more records written while the service is down ({left()} in the spools)")
    time.sleep(max(0.0, a.down_s - (time.monotonic() - down_at)))
    site.start()
    say(f"gpueff serve back after {time.monotonic() - down_at:.0f} s; {left()} in the spools")
    back = time.monotonic()
    until(lambda: left() == 0, "the spools to drain")
    say(f"spools empty {time.monotonic() - back:.1f} s after the service came back")
    for p in fwd:
        p.send_signal(signal.SIGTERM)
        p.wait(60)
    with eng.connect() as c:
        rows, distinct, jobs = c.execute(text(
            "SELECT count(*), count(DISTINCT (j.cluster, j.job_id, g.node, g.gpu_index)), count(DISTINCT j.id) "
            "FROM job_gpu g JOIN job j ON j.id = g.job_pk")).one()
    log = Path(site.log).read_text()
    print(f"written {written}; job_gpu rows {rows}, distinct keys {distinct}, jobs {jobs}")
    print(f"lost {written - distinct}, duplicated {rows - distinct}")
    print(f"service log: {answered(log, 200)} pushes answered 200, {answered(log, 503)} 503, "
          f"{answered(log, 401)} 401; forwarder logs: "
          f"{sum(Path(x).read_text().count('cannot reach') for x in logs)} unreachable passes")
    site.kill(signal.SIGTERM)
    munged.kill()
    eng.dispose()
    shutil.rmtree(base, ignore_errors=True)
    return 0 if written == distinct == rows == jobs else 1


if __name__ == "__main__":
    sys.exit(main())
