#!/usr/bin/env python3
"""A 50,000-GPU site simulated end to end on PostgreSQL: a year of history, the real ``gpueff serve``, and
thousands of simulated GPU nodes pushing through the real forwarder, measured against floors from this run.

The load (bench/README.md "Site scale"), at ``--scale 1``: 50,000 GPUs on 6,250 nodes of 8; 25,000 jobs
running (1-8 GPUs each), each sending a live record every ``--live-period`` (300 s); 6,000 jobs ending per
hour, each with its final record; a year of history: 10 million finished jobs, about 3.2 GPUs each, with
their per-GPU timelines for the last ``--timeline-days``; a 1-hour outage of the service, after which every
node pushes its backlog (at least 160,000 records) at once. ``--scale 0.1`` is the tenth; ``--quick`` a
hundredth with a 30-s live period, in under 5 minutes. One user has 50,000 jobs and one account 500,000
(scaled), for ``seff-gpu -u`` and ``-A``.

Stages, each timed, with its floor from the same run where one exists:

1. history: COPY into ``job``, ``job_gpu``, ``job_gpu_timeline`` (rows/s: the COPY floor), then the rollups
   of every month; one month's rollup again against the bare ``SELECT ... GROUP BY`` of that month;
2. steady: ``gpueff serve`` (private munged, the API on loopback) and the nodes' forwarders (threads in a few
   processes, the real ``node/push.py`` loop; at nice 19 with a munged of their own, as a real site's nodes
   have their own CPUs and munged) while this script writes the live and final records into the
   nodes' spools at the load's rates; the lag of a record is from its file landing in a node's spool to the
   forwarder removing it, which it does once the service has acknowledged it (after the commit); the
   database's growth over the measured half, per day;
3. outage: the service stopped, a backlog written into the spools, the service started; the time until every
   spool is empty, then every backlog job counted by key in the database (lost, duplicated);
4. passes, in this process on the same database: the idle-GPU policy over the running jobs (squeue stands in:
   every job RUNNING; dry run; floor: their job and GPU rows read alone), enrichment of an hour's ended jobs
   through ``sacct --json`` (a stand-in ``sacct`` that prints 24.11's real data_parser v0.0.42 shape for the
   simulated jobs), monthly summaries for every account (dry run: rendered and archived, not mailed);
5. reads through the service: ``seff-gpu JOBID`` (p50/p99 against ``python3 -c pass``), ``seff-gpu -u``
   for the heavy user and ``-A`` for the heavy account, a ``/metrics`` scrape (time, size); the service's
   peak RSS.

    python3 bench/site_scale.py [--scale 1 | --quick] [--postgres URL] [--db NAME] [--steady 600] [--keep]
                                 [--history-only | --reuse] [--profile DIR]

Root, MUNGE and PostgreSQL needed (tests/setup-services.sh).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests"), os.path.join(_ROOT, "bench")]

import sitecount  # noqa: E402
import synthetic  # noqa: E402
from daemons import free_port  # noqa: E402
from pushsite import answered, cpu_s, fresh_pg, node_name, rss_mb, run_nodes, start_node_munged, start_site  # noqa: E402

from slurm_gpueff import spool  # noqa: E402

FULL = {"nodes": 6250, "running": 25000, "ends_per_h": 6000, "history": 10_000_000, "backlog": 160_000,
        "heavy_user": 50_000, "heavy_account": 500_000, "accounts": 500, "users": 5000}
GPUS = (1, 1, 1, 2, 2, 4, 4, 8, 8, 1)  # about 3.2 a job
CLUSTER = "scale"
DAY = 86400.0
TIMELINE_POINTS = 100  # the most a record carries (node.integrals.timeline_points); jobs over 100 min do


def sizes(scale: float) -> dict[str, int]:
    out = {k: max(1, round(v * scale)) for k, v in FULL.items()}
    out["accounts"] = max(2, min(FULL["accounts"], round(FULL["accounts"] * max(scale, 0.1))))
    out["users"] = max(10, min(FULL["users"], round(FULL["users"] * max(scale, 0.1))))
    return out


def q(xs: list[float], p: float) -> float:
    return xs[min(len(xs) - 1, int(p * (len(xs) - 1)))] if xs else float("nan")


class Log:
    """Prints and keeps the figures (the summary table at the end)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []
        self.t0 = time.time()

    def say(self, text: str) -> None:
        print(f"[{time.time() - self.t0:7.1f} s] {text}", flush=True)

    def figure(self, name: str, value: str, floor: str, goal: str) -> None:
        self.rows.append((name, value, floor, goal))
        self.say(f"{name}: {value}" + (f" (floor: {floor})" if floor else "") + f" [goal {goal}]")


# ------------------------------------------------------------------------------------------------ history
def history(url: str, n: int, sz: dict[str, int], timeline_days: float, log: Log) -> dict[str, Any]:
    """COPY ``n`` finished jobs of the past year (ids 1..n) with their GPUs; timelines for the newest days."""
    import psycopg

    rng = random.Random(7)
    now = time.time()
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    users = [f"u{i:05d}" for i in range(sz["users"])]
    accounts = [f"a{i:03d}" for i in range(sz["accounts"])]
    heavy_user, heavy_account = users[0], accounts[0]
    home = home_accounts(users, accounts)
    verdicts = synthetic.VERDICTS
    t_gpu = t_job = t_tl = 0.0
    n_gpu = n_tl = 0
    jcols = ("id, cluster, job_id, run, job_name, \"user\", uid, account, partition, nodelist, gpu_count, gpu_type, "
             "start_time, end_time, elapsed_s, state, exit_code, signal, backend, record_source, enriched, "
             "ingested_at, gpu_hours, idle_gpu_hours, underfilled_gpu_hours, sm_active_gpu_hours, "
             "tensor_active_gpu_hours, kernel_active, sm_active, tensor_active, energy_j, verdict, analyzed_at")
    gcols = ("job_pk, node, gpu_index, minor, uuid, model, memory_total_bytes, start_time, end_time, kernel_active, "
             "sm_active, sm_occupancy, tensor_active, dram_active, memory_used_peak_bytes, energy_j, power_mean_w, "
             "source, samples, window_s, measured_s")
    chunk = 100_000
    tl_since = now - timeline_days * DAY
    with psycopg.connect(dsn, autocommit=False) as conn:
        for lo in range(1, n + 1, chunk):
            hi = min(n, lo + chunk - 1)
            jobs, gpus, tls = [], [], []
            for jid in range(lo, hi + 1):
                end = now - 365 * DAY * (n - jid) / n - 600  # ids in end-time order, the newest ten minutes ago
                dur = rng.uniform(300, 8 * 3600)
                start = end - dur
                ng = GPUS[jid % len(GPUS)]
                user = heavy_user if jid % 200 == 0 else users[1 + jid % (len(users) - 1)]
                account = home[user]
                node = node_name(jid % sz["nodes"])
                k = rng.random()
                s = k * rng.random()
                t = s * rng.random()
                gh = ng * dur / 3600
                sdt, edt = (datetime.fromtimestamp(x, UTC).replace(tzinfo=None) for x in (start, end))
                jobs.append((jid, CLUSTER, jid, 0, f"job{jid % 97}", user, 10000 + jid % 5000, account, "gpu", node,
                             ng, "h100", sdt, edt, dur, "COMPLETED", 0, 0, "nvml", "hook", True, edt, gh,
                             gh * (1 - k), gh * (k - s), gh * s, gh * t, k, s, t, dur * 400.0 * ng,
                             verdicts[jid % len(verdicts)], edt))
                for i in range(ng):
                    gpus.append((jid, node, i, i, f"GPU-{jid:010d}-{i}", "NVIDIA H100 80GB HBM3", 80 << 30, sdt, edt,
                                 k, s, s * 0.8, t, s * 0.4, (1 << 30) * (1 + jid % 79), dur * 400.0, 400.0, "nvml",
                                 int(dur / 5), dur, dur))
                if end >= tl_since:
                    tls.append((jid, ng, dur, k, s, t))
            t0 = time.perf_counter()
            with conn.cursor() as cur, cur.copy(f"COPY job ({jcols}) FROM STDIN") as cp:
                for row in jobs:
                    cp.write_row(row)
            t_job += time.perf_counter() - t0
            t0 = time.perf_counter()
            with conn.cursor() as cur, cur.copy(f"COPY job_gpu ({gcols}) FROM STDIN") as cp:
                for row in gpus:
                    cp.write_row(row)
            t_gpu += time.perf_counter() - t0
            n_gpu += len(gpus)
            if tls:
                t0 = time.perf_counter()
                with conn.cursor() as cur:
                    ids = {}
                    for jid, gid, gi in cur.execute("SELECT job_pk, id, gpu_index FROM job_gpu WHERE job_pk = ANY(%s)",
                                                    ([x[0] for x in tls],)).fetchall():
                        ids[(jid, gi)] = gid
                    with cur.copy("COPY job_gpu_timeline (job_gpu_id, points) FROM STDIN") as cp:
                        for jid, ng, dur, k, s, t in tls:
                            pts = json.dumps([[round(dur * (p + 1) / TIMELINE_POINTS, 1), round(k, 4), round(s, 4),
                                               round(t, 4)] for p in range(TIMELINE_POINTS)], separators=(",", ":"))
                            for i in range(ng):
                                cp.write_row((ids[(jid, i)], pts))
                                n_tl += 1
                t_tl += time.perf_counter() - t0
            conn.commit()
            if (hi // chunk) % 10 == 0 or hi == n:
                log.say(f"history: {hi:,} of {n:,} jobs, {n_gpu:,} GPU rows, {n_tl:,} timelines")
        with conn.cursor() as cur:
            cur.execute("SELECT setval(pg_get_serial_sequence('job', 'id'), %s)", (n,))
        conn.commit()
        t0 = time.perf_counter()
        conn.autocommit = True
        conn.execute("ANALYZE")
        t_an = time.perf_counter() - t0
    sizes_ = relation_bytes(url)
    per_job = (sizes_["job"] + sizes_["job_gpu"]) / n
    per_tl = sizes_["job_gpu_timeline"] / max(1, n_tl)
    jobs_day = FULL["ends_per_h"] * 24
    tl_day = jobs_day * n_gpu / n * per_tl
    day = jobs_day * per_job + tl_day
    log.figure("database growth per day", f"{day / 1e9:.2f} GB/day at the full load: {jobs_day:,} jobs x "
               f"({per_job:,.0f} B a job with its GPU rows and indexes + {n_gpu / n:.1f} x {per_tl:,.0f} B a GPU "
               f"timeline of {TIMELINE_POINTS} points); the timelines' {tl_day / 1e9:.2f} GB/day are pruned after "
               "[service] timeline_retention_days; live rows are replaced, not added", "", "<= 2 GB/day")
    log.figure("history COPY", f"{n:,} jobs in {t_job:.1f} s ({n / t_job:,.0f}/s), {n_gpu:,} GPU rows in {t_gpu:.1f} s "
               f"({n_gpu / t_gpu:,.0f}/s), {n_tl:,} timelines in {t_tl:.1f} s; ANALYZE {t_an:.1f} s",
               "this is the COPY floor", "fast")
    return {"heavy_user": heavy_user, "heavy_account": heavy_account, "copy_rows_per_s": (n + n_gpu) / (t_job + t_gpu),
            "users": users, "home": home, "first_id": n + 1}


def reused_history(url: str, sz: dict[str, int], log: Log) -> dict[str, Any]:
    """What :func:`history` returns, for the database an earlier run made (``--reuse``): the same users and
    accounts; the running jobs take ids above every job there (the earlier run's included)."""
    from sqlalchemy import create_engine, text

    users = [f"u{i:05d}" for i in range(sz["users"])]
    accounts = [f"a{i:03d}" for i in range(sz["accounts"])]
    eng = create_engine(url)
    with eng.begin() as c:  # the earlier run's running jobs would be running twice: its simulation has ended
        gone = c.execute(text("DELETE FROM job WHERE record_source = 'live'")).rowcount
        top = int(c.execute(text("SELECT coalesce(max(job_id), 0) FROM job")).scalar() or 0)
        jobs = int(c.execute(text("SELECT count(*) FROM job")).scalar() or 0)
    eng.dispose()
    log.say(f"history: reused, {jobs:,} jobs (ids up to {top:,}; the earlier run's {gone:,} running jobs removed); "
            "the COPY floor is in the log of the run that made it")
    return {"heavy_user": users[0], "heavy_account": accounts[0], "copy_rows_per_s": None, "users": users,
            "home": home_accounts(users, accounts), "first_id": top + 1}


def home_accounts(users: list[str], accounts: list[str]) -> dict[str, str]:
    """Each user's one account, as at a real site: the first 5 % of users (the heavy user among them) in the
    heavy account, so that it has about 500,000 of the 10 M jobs; the others spread over the rest."""
    cut = max(1, len(users) // 20)
    return {u: accounts[0] if i < cut else accounts[1 + i % (len(accounts) - 1)] for i, u in enumerate(users)}


def relation_bytes(url: str) -> dict[str, int]:
    """Each table's size on disk with its indexes and TOAST."""
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.connect() as c:
        out = {t: int(c.execute(text("SELECT pg_total_relation_size(CAST(:t AS regclass))"), {"t": t}).scalar() or 0)
               for t in ("job", "job_gpu", "job_gpu_timeline", "live_sample")}
    eng.dispose()
    return out


def rollup_figures(url: str, log: Log) -> None:
    from sqlalchemy import text

    from slurm_gpueff.storage import rollups
    from slurm_gpueff.storage.db import make_engine

    eng = make_engine(url, create=False)
    t0 = time.perf_counter()
    res = rollups.refresh(eng, full=True)
    log.say(f"rollups of every month: {len(res.months)} months, {res.rows:,} rows in {time.perf_counter() - t0:.1f} s")
    month = rollups.month_start(datetime.now(UTC) - timedelta(days=40))
    t0 = time.perf_counter()
    rollups.refresh(eng, months=[month])
    one = time.perf_counter() - t0
    nxt = rollups.next_month(month)
    sums = ('count(*), sum(gpu_hours), sum(idle_gpu_hours), sum(underfilled_gpu_hours), sum(sm_active_gpu_hours), '
            'sum(tensor_active_gpu_hours), sum(energy_j) FROM job WHERE end_time >= :a AND end_time < :b AND '
            "analyzed_at IS NOT NULL AND record_source != 'live'")
    t0 = time.perf_counter()
    with eng.connect() as c:  # fetched, so that PostgreSQL computes every sum (under a count(*) it drops them)
        c.exec_driver_sql("SET jit = off")
        days = c.execute(text(f'SELECT CAST(end_time AS date), cluster, "user", account, {sums} '
                              'GROUP BY 1, cluster, "user", account'), {"a": month, "b": nxt}).fetchall()
        months = c.execute(text(f'SELECT cluster, "user", account, verdict, {sums} GROUP BY cluster, "user", '
                                'account, verdict'), {"a": month, "b": nxt}).fetchall()
    bare = time.perf_counter() - t0
    log.figure("rollup of one month", f"{one:.2f} s ({month:%Y-%m})",
               f"its two GROUP BYs alone, fetched: {bare:.2f} s ({len(days):,} day and {len(months):,} month rows); "
               f"ratio {one / bare:.1f}", "<= 10 s")
    eng.dispose()


# ------------------------------------------------------------------------------------------------ nodes
class Running:
    """The jobs running now: id -> (node, gpus, start); finals replace them with new ones."""

    def __init__(self, first_id: int, n: int, nodes: int, rng: random.Random) -> None:
        self.rng, self.nodes, self.next_id = rng, nodes, first_id
        self.jobs: dict[int, tuple[int, int, float]] = {}
        now = time.time()
        for _ in range(n):
            self.add(now - rng.uniform(60, 8 * 3600))

    def add(self, start: float) -> int:
        jid = self.next_id
        self.next_id += 1
        self.jobs[jid] = (self.rng.randrange(self.nodes), GPUS[jid % len(GPUS)], start)
        return jid


def record_of(jid: int, node: int, gpus: int, start: float, end: float, live: bool, users: list[str],
              home: dict[str, str]) -> dict[str, Any]:
    rec = synthetic.record(jid, cluster=CLUSTER, node=node_name(node), gpus=gpus, timeline_points=TIMELINE_POINTS,
                           end=end)
    rec["start_time"] = start
    rec["user"] = users[1 + jid % (len(users) - 1)]
    rec["account"] = home[rec["user"]]
    if live:
        rec.update(live=True, exit_code=None, signal=None)
    return rec


class Writer:
    """Writes records into the nodes' spools and follows each file until its forwarder removed it."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.pending: dict[str, float] = {}  # path -> when written
        self.lags: list[float] = []
        self.replaced = 0
        self.lock = threading.Lock()

    def write(self, node: int, rec: dict[str, Any]) -> None:
        d = os.path.join(self.base, "nodes", node_name(node), "spool")
        path = spool.write_record(d, rec, durable=not rec.get("live"))
        with self.lock:
            if path in self.pending:
                self.replaced += 1  # the node's previous snapshot of this job was still waiting
            self.pending[path] = time.time()

    def poll(self) -> None:
        with self.lock:
            items = list(self.pending.items())
        now = time.time()
        gone = [(p, t) for p, t in items if not os.path.exists(p)]
        with self.lock:
            for p, t in gone:
                if self.pending.get(p) == t:
                    del self.pending[p]
                    self.lags.append(now - t)


def db_bytes(url: str) -> int:
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.connect() as c:
        n = int(c.execute(text("SELECT pg_database_size(current_database())")).scalar() or 0)
    eng.dispose()
    return n


def steady(a: argparse.Namespace, sz: dict[str, int], url: str, base: str, running: Running, hist: dict[str, Any],
           log: Log, site_pid: int) -> Writer:
    """The load for ``a.steady`` seconds: live records every ``a.live_period`` per running job, finals at the
    hourly rate; the second half's database growth."""
    w = Writer(base)
    stop = threading.Event()

    def poller() -> None:
        while not stop.is_set():
            w.poll()
            time.sleep(0.5)

    th = threading.Thread(target=poller, daemon=True)
    th.start()
    rng = random.Random(11)
    live_rate = len(running.jobs) / a.live_period
    end_rate = sz["ends_per_h"] / 3600.0
    log.say(f"steady: {len(running.jobs):,} running jobs on {sz['nodes']:,} nodes; live {live_rate:.1f}/s, "
            f"final {end_rate:.2f}/s for {a.steady:.0f} s")
    order = list(running.jobs)
    rng.shuffle(order)
    t0 = time.time()
    half_at, size0, cpu0 = t0 + a.steady / 2, None, cpu_s(site_pid)
    prof: Profile | None = None
    ends, lives = 0, 0
    next_live, next_end = t0, t0
    while (now := time.time()) - t0 < a.steady:
        if size0 is None and now >= half_at:
            size0, t_half = db_bytes(url), now
            prof = Profile(a.profile, "steady load", site_pid, log)
        while next_live <= now:
            if not order:
                order = list(running.jobs)
                rng.shuffle(order)
            jid = order.pop()
            if jid in running.jobs:
                node, g, start = running.jobs[jid]
                w.write(node, record_of(jid, node, g, start, now, True, hist["users"], hist["home"]))
                lives += 1
            next_live += 1.0 / live_rate
        while next_end <= now:
            jid = rng.choice(list(running.jobs)) if running.jobs else None
            if jid is not None:
                node, g, start = running.jobs.pop(jid)
                w.write(node, record_of(jid, node, g, start, now, False, hist["users"], hist["home"]))
                ends += 1
                running.add(now)
            next_end += 1.0 / end_rate
        time.sleep(0.02)
    deadline = time.time() + 3 * a.interval + 30
    while w.pending and time.time() < deadline:
        time.sleep(0.5)
    size1, t_end = db_bytes(url), time.time()
    cpu = cpu_s(site_pid) - cpu0
    if prof is not None:
        prof.done()
    stop.set()
    th.join()
    lags = sorted(w.lags)
    per_day = (size1 - size0) / (t_end - t_half) * DAY if size0 is not None else float("nan")
    log.figure("ingest lag at steady load", f"p50 {q(lags, 0.5):.1f} s, p99 {q(lags, 0.99):.1f} s, max "
               f"{lags[-1] if lags else float('nan'):.1f} s over {len(lags):,} records ({lives:,} live, "
               f"{ends:,} final; "
               f"{len(w.pending)} not acknowledged, {w.replaced} live snapshots replaced while waiting)",
               f"forward_interval_s {a.interval:g}", "p99 < 60 s")
    log.figure("service CPU at steady load", f"{100 * cpu / (t_end - t0):.1f} % of one core "
               f"({1000 * cpu / max(1, len(lags)):.2f} ms per record)", "", "-")
    log.figure("database size over the steady load", f"+{(size1 - size0) / 1e6:.1f} MB in {t_end - t_half:.0f} s "
               f"({per_day / 1e9:.2f} GB/day at this rate: mostly the dead row versions of live rows replaced, "
               f"which autovacuum makes reusable)", "", "-")
    return w


def outage(a: argparse.Namespace, sz: dict[str, int], url: str, base: str, site: Any, running: Running,
           hist: dict[str, Any], log: Log, nodes: list[int]) -> int:
    """Stop the service, write the backlog, start it, time the drain; count by key."""
    from sqlalchemy import create_engine

    site.kill(signal.SIGTERM)
    log.say("outage: service stopped")
    w = Writer(base)
    now = time.time()
    finals: set[int] = set()
    n_live = 0
    for jid, (node, g, start) in list(running.jobs.items()):  # each running job's newest snapshot
        w.write(node, record_of(jid, node, g, start, now, True, hist["users"], hist["home"]))
        n_live += 1
    while n_live + len(finals) < sz["backlog"]:  # the jobs that ended in the hour
        jid = running.add(now - 3600)
        node, g, start = running.jobs.pop(jid)
        w.write(node, record_of(jid, node, g, start, now - random.uniform(0, 3600), False, hist["users"],
                                hist["home"]))
        finals.add(jid)
    n = n_live + len(finals)
    log.say(f"outage: backlog of {n:,} records written ({n_live:,} running jobs' newest live records, "
            f"{len(finals):,} finals) in {time.time() - now:.0f} s; the service comes back")
    t0 = time.time()
    with open(site.log) as fh:
        log_from = len(fh.read())
    nodes_cpu0 = sum(cpu_s(p) for p in nodes)
    pid = site.start()
    prof = Profile(a.profile, "drain", pid, log)
    while w.pending and time.time() - t0 < a.drain_limit:
        w.poll()
        time.sleep(1.0)
    drain = time.time() - t0
    prof.done()
    cpu_note = (f"CPU over the drain: the service {cpu_s(pid):.0f} s, the simulated nodes "
                f"{sum(cpu_s(p) for p in nodes) - nodes_cpu0:.0f} s (all on this machine, beside PostgreSQL)")
    with open(site.log) as fh:
        after = fh.read()[log_from:]
    stored_lines = re.findall(r"^(\S+ \S+) .*records, stored (\d+),", after, re.M)
    busy = answered(after, 503)
    if stored_lines:
        first = datetime.strptime(stored_lines[0][0], "%Y-%m-%d %H:%M:%S,%f")
        last = datetime.strptime(stored_lines[-1][0], "%Y-%m-%d %H:%M:%S,%f")
        span = max((last - first).total_seconds(), 1e-3)
        n_stored = sum(int(k) for _t, k in stored_lines)
        service_side = (f"the service stored {n_stored:,} records in {len(stored_lines):,} pushes over {span:.0f} s "
                        f"from its first to its last ({n_stored / span:,.0f}/s), {busy:,} pushes told busy")
    else:
        service_side = "no push stored"
    eng = create_engine(url)
    counted = sitecount.counts(eng, CLUSTER, finals)  # lost by job id, duplicated by content (any run, any key)
    eng.dispose()
    log.figure("1-hour backlog drained", f"{n:,} records in {drain:.0f} s ({n / drain:,.0f}/s) from the service's "
               f"start, nodes backing off up to {a.backoff:g} s; {counted.line()}; {len(w.pending)} files left; "
               f"{service_side}; {cpu_note}",
               f"COPY {hist['copy_rows_per_s']:,.0f} rows/s" if hist["copy_rows_per_s"] else "",
               "<= 5 min, 0 lost, 0 duplicated")
    return pid


# ------------------------------------------------------------------------------------------------ profile
KINDS = (("api request", "slurm_gpueff/service/api.py"), ("summarize", "summarize_pending"),
         ("other task", "run_task"), ("accept", "serve_forever"))


class Profile:
    """py-spy sampling the service's threads (wall-clock, idle included) while a stage runs, then where each
    kind of thread spent it: the frames of this package and the calls out of it (subprocess, socket, driver)."""

    def __init__(self, out_dir: str | None, stage: str, pid: int, log: Log) -> None:
        self.path = os.path.join(out_dir, f"{stage}.txt") if out_dir else None
        self.stage, self.log, self.proc = stage, log, None
        exe = shutil.which("py-spy") or shutil.which("py-spy", path=os.path.dirname(sys.executable))
        if self.path and exe:
            os.makedirs(out_dir or ".", exist_ok=True)
            self.proc = subprocess.Popen([exe, "record", "-p", str(pid), "--threads", "--idle", "-r", "20",
                                          "-f", "raw", "-o", self.path, "--nonblocking"],
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        elif self.path:
            log.say("profile: py-spy is not installed (pip install py-spy); not profiled")

    def done(self) -> None:
        if self.proc is None or self.path is None:
            return
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(60)
        kinds: Counter[str] = Counter()
        frames: dict[str, Counter[str]] = {}
        total = 0
        with open(self.path) as fh:
            for line in fh:
                stack, _, n = line.rstrip("\n").rpartition(" ")
                if not n.isdigit():
                    continue
                count = int(n)
                total += count
                kind = next((k for k, mark in KINDS if mark in stack), "other")
                kinds[kind] += count
                seen = {re.sub(r":\d+\)$", ")", f) for f in stack.split(";")[1:]}
                frames.setdefault(kind, Counter()).update(dict.fromkeys(seen, count))
        self.log.say(f"profile of the {self.stage} ({self.path}): {total:,} thread samples")
        for kind, n in kinds.most_common():
            self.log.say(f"  {kind}: {n:,} samples")
            top = frames[kind].most_common()
            shown = [(f, c) for f, c in top if "slurm_gpueff" in f or any(
                m in f for m in ("subprocess.py", "socket.py", "psycopg", "threading.py", "acquire"))][:18]
            for f, c in shown:
                self.log.say(f"      {100 * c / n:5.1f} %  {f[:150]}")


# ------------------------------------------------------------------------------------------------ passes
STANDIN_SACCT = r'''#!/usr/bin/env python3
"""A stand-in sacct for bench/site_scale.py: 24.11's sacct --json (data_parser/v0.0.42) for the simulated
jobs in JOBS (job id -> [user, account, start, end, node, gpus]); -P queries print nothing."""
import copy, json, sys
args = sys.argv[1:]
if "--json" not in args:
    sys.exit(0)
jobs = json.load(open(JOBS))
tmpl = json.load(open(TEMPLATE))
proto = tmpl["jobs"][0]
ids = [i for i in args[args.index("-j") + 1].split(",")] if "-j" in args else list(jobs)
out = []
for i in ids:
    j = jobs.get(i)
    if j is None:
        continue
    user, account, start, end, node, gpus = j
    o = copy.deepcopy(proto)
    o.update(job_id=int(i), user=user, account=account, nodes=node, cluster=CLUSTER, name="job" + i)
    o["time"].update(start=int(start), end=int(end), submission=int(start) - 60, eligible=int(start) - 60,
                     elapsed=int(end - start))
    for t in o["tres"]["allocated"] + o["tres"]["requested"]:
        if t["type"] == "gres" and t["name"] == "gpu":
            t["count"] = gpus
    out.append(o)
tmpl["jobs"] = out
json.dump(tmpl, sys.stdout)
'''


def passes(sz: dict[str, int], url: str, base: str, running: Running, log: Log) -> None:
    from sqlalchemy import create_engine, text

    from slurm_gpueff.service.alerts import run_alerts
    from slurm_gpueff.slurm.commands import SlurmJob
    from slurm_gpueff.slurm.sacct import SacctReader
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.enrich import enrich_jobs

    cfg = _pass_config(base, url)
    eng = make_engine(url, create=False)
    n_live = len(running.jobs)
    t0 = time.perf_counter()
    res = run_alerts(eng, cfg, dry_run=True, squeue=lambda ids: {i: SlurmJob("RUNNING", "gpu", "normal", False)
                                                                 for i in ids},
                     act=lambda *_a: "bench: not acted on")
    alerts_s = time.perf_counter() - t0
    with eng.connect() as c:  # the floor: the running jobs' rows and their GPUs' rows read, nothing decided
        t0 = time.perf_counter()
        live = c.execute(text("SELECT * FROM job WHERE record_source = 'live'")).all()
        gpus = c.execute(text("SELECT g.* FROM job_gpu g JOIN job j ON j.id = g.job_pk "
                              "WHERE j.record_source = 'live'")).all()
        read_s = time.perf_counter() - t0
    log.figure("idle-alert pass", f"{alerts_s:.1f} s over {res.judged:,} running jobs ({n_live:,} running in the "
               f"simulation; {len(res.actions)} actions, dry run)",
               f"their {len(live):,} job rows and {len(gpus):,} GPU rows read alone: {read_s:.2f} s", "<= 30 s")

    # enrichment: an hour's ended jobs, through the stand-in sacct
    eng2 = create_engine(url)
    with eng2.connect() as c:
        rows = c.execute(text("SELECT job_id, \"user\", account, extract(epoch from start_time), "
                              "extract(epoch from end_time), nodelist, gpu_count FROM job WHERE cluster = :c AND "
                              "NOT enriched AND record_source = 'hook' ORDER BY id LIMIT :n"),
                         {"c": CLUSTER, "n": sz["ends_per_h"]}).all()
    eng2.dispose()
    jobs = {str(r[0]): [r[1], r[2], float(r[3]), float(r[4]), r[5], int(r[6])] for r in rows}
    d = os.path.join(base, "sacct")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "jobs.json"), "w") as fh:
        json.dump(jobs, fh)
    exe = os.path.join(d, "sacct")
    with open(exe, "w") as fh:
        fh.write(STANDIN_SACCT.replace("JOBS", repr(os.path.join(d, "jobs.json")))
                 .replace("TEMPLATE", repr(os.path.join(_ROOT, "tests/data/sacct/24.11.5/sacct.v0.0.42.json")))
                 .replace("CLUSTER", repr(CLUSTER)))
    os.chmod(exe, 0o755)
    t0 = time.perf_counter()
    out = subprocess.run([exe, "--json", "-X", "-D", "-j", ",".join(list(jobs)[:500])], capture_output=True, check=True)
    one_call = time.perf_counter() - t0
    reader = SacctReader(command=exe, timeout_s=120, batch_size=500, fmt="json")
    t0 = time.perf_counter()
    er = enrich_jobs(eng, reader, settle_s=0, limit=len(jobs))
    enrich_s = time.perf_counter() - t0
    calls = -(-len(jobs) // 500)
    log.figure("enrichment pass", f"{enrich_s:.1f} s for {er.checked:,} jobs ({er.enriched:,} enriched, "
               f"{er.not_found} not found; {len(er.errors)} errors{': ' + er.errors[0] if er.errors else ''})",
               f"the stand-in sacct alone: {calls} calls x {one_call:.2f} s ({len(out.stdout) / 1e6:.1f} MB a call)",
               "<= 60 s")

    # monthly summaries of last month for every account (dry run: rendered, archived)
    from slurm_gpueff.reports import runner

    month = (datetime.now(UTC).replace(day=1) - timedelta(days=1)).strftime("%Y-%m")
    with eng.begin() as c:  # a reused database's earlier run wrote them: they would be skipped as done
        c.execute(text("DELETE FROM report_log WHERE kind = 'monthly' AND dry_run"))
    t0 = time.perf_counter()
    rr = runner.send_monthly(cfg, eng, month=month, dry_run=True)
    monthly_s = time.perf_counter() - t0
    n_written = sum(1 for _r, _d, files in os.walk(os.path.join(base, "pass", "reports")) for f in files
                    if f.endswith(".eml"))
    log.figure("monthly summaries", f"{monthly_s:.1f} s for {month}: {n_written} summaries written "
               f"({sz['accounts']} accounts and the site's; dry run: rendered and archived, not mailed)",
               "", "<= 5 min")
    del rr
    eng.dispose()


def _pass_config(base: str, url: str) -> Any:
    from slurm_gpueff.config import load

    path = os.path.join(base, "pass.toml")
    with open(path, "w") as fh:
        fh.write(f'[site]\ncluster = "{CLUSTER}"\n[paths]\nspool_dir = "{base}/pass/spool"\n'
                 f'state_dir = "{base}/pass/run"\ndatabase = "{url}"\n[alerts]\nenabled = true\n'
                 f'[reports]\ndir = "{base}/pass/reports"\ncoordinators_as_leads = false\n')
    return load(path)


# ------------------------------------------------------------------------------------------------ reads
def reads(a: argparse.Namespace, site: Any, hist: dict[str, Any], n_hist: int, metrics_port: int, log: Log,
          base: str) -> None:
    env = dict(os.environ, GPUEFF_SEFF_VIA="service", GPUEFF_CONFIG=site.config,
               PYTHONPATH=_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    python = sys.executable
    if a.seff_python:  # a site's install (not this checkout's editable one), as users run seff-gpu
        python = a.seff_python
        env.pop("PYTHONPATH")
    seff = [python, "-m", "slurm_gpueff.cli.seff"]
    # Byte-compiled first, as `pip install` leaves a package: where PYTHONDONTWRITEBYTECODE is set (this
    # machine sets it) every run would otherwise compile each module from its source again.
    pkg = subprocess.run([python, "-c", "import os, slurm_gpueff; print(os.path.dirname(slurm_gpueff.__file__))"],
                         env=env, capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([python, "-m", "compileall", "-q", pkg], env=env, capture_output=True, check=True)

    def wall(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
        t = time.perf_counter()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        return time.perf_counter() - t, r

    rng = random.Random(5)
    bare = sorted(wall([python, "-c", "pass"])[0] for _ in range(10))
    times, bad = [], 0
    for _ in range(a.seff_runs):
        dt, r = wall([*seff, str(rng.randint(1, n_hist))])
        times.append(dt)
        bad += r.returncode != 0
        if r.returncode != 0 and bad == 1:
            log.say(f"seff-gpu failed: {r.stderr.strip()[:300]}")
    times.sort()
    log.figure("seff-gpu JOBID through the API", f"p50 {1000 * q(times, 0.5):.0f} ms, "
               f"p99 {1000 * q(times, 0.99):.0f} ms over {len(times)} jobs ({bad} failed)",
               f"python3 -c pass {1000 * q(bare, 0.5):.0f} ms ({python})",
               "<= 100 / 300 ms")
    for flag, who, n in (("-u", hist["heavy_user"], "user"), ("-A", hist["heavy_account"], "account")):
        dt, r = wall([*seff, flag, who, "-S", (datetime.now() - timedelta(days=366)).strftime("%Y-%m-%d")])
        lines = r.stdout.count("\n")
        log.figure(f"seff-gpu {flag} (the heavy {n})", f"{dt:.2f} s, exit {r.returncode}, {lines} lines, "
                   f"{len(r.stdout) / 1e3:.0f} kB{': ' + r.stderr.strip()[:200] if r.returncode else ''}", "", "<= 2 s")
        with open(os.path.join(base, f"seff{flag}.txt"), "w") as fh:
            fh.write(r.stdout[:20000])
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60) as resp:
        body = resp.read()
    scrape = time.perf_counter() - t0
    series = sum(1 for ln in body.splitlines() if ln and not ln.startswith(b"#"))
    log.figure("/metrics scrape", f"{scrape:.2f} s, {len(body) / 1e3:.0f} kB, {series:,} series", "", "<= 1 s")


# ------------------------------------------------------------------------------------------------ main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="of the full load (0.1: a tenth)")
    ap.add_argument("--quick", action="store_true", help="a hundredth, 30-s live period: under 5 minutes")
    ap.add_argument("--steady", type=float, help="seconds of steady load (default: two live periods)")
    ap.add_argument("--live-period", type=float, default=300.0)
    ap.add_argument("--interval", type=float, default=15.0, help="[service] forward_interval_s (default 15)")
    ap.add_argument("--backoff", type=float, default=120.0,
                    help="[service] forward_max_backoff_s (default 120, the product's default)")
    ap.add_argument("--timeline-days", type=float, default=7.0, help="history days that keep their timelines")
    ap.add_argument("--drain-limit", type=float, default=1800.0)
    ap.add_argument("--seff-runs", type=int, default=50)
    ap.add_argument("--seff-python", help="the Python of a site install of slurm-gpueff to run seff-gpu with "
                    "(default: this one, with this checkout on its path)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--postgres", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--db", default="gpueff_site_scale",
                    help="the database's name on the --postgres server (made afresh unless --reuse)")
    ap.add_argument("--profile", metavar="DIR",
                    help="py-spy records the service's threads over the steady load and the drain into DIR "
                    "(raw stacks, wall-clock, idle threads included) and prints where each kind of thread spent it")
    ap.add_argument("--reuse", action="store_true",
                    help="keep the database an earlier run of this scale left (its history and rollups are not "
                    "made or timed again); the rest runs as usual, the running jobs under new ids")
    ap.add_argument("--history-only", action="store_true",
                    help="stop after the history and the rollup figures (the database stays: one to profile on)")
    a = ap.parse_args()
    if a.quick:
        a.scale, a.live_period = 0.01, 30.0
        a.steady = a.steady or 60.0
        a.seff_runs = min(a.seff_runs, 20)
    a.steady = a.steady or 2 * a.live_period
    sz = sizes(a.scale)
    log = Log()
    log.say(f"scale {a.scale:g}: {json.dumps(sz)}")
    from slurm_gpueff.storage import migrate
    from slurm_gpueff.storage.db import make_engine

    if a.reuse:
        url = a.postgres.rsplit("/", 1)[0] + "/" + a.db
        migrate.upgrade(make_engine(url, create=False))
        hist = reused_history(url, sz, log)
    else:
        url = fresh_pg(a.postgres, a.db)
        migrate.upgrade(make_engine(url, create=False))
        hist = history(url, sz["history"], sz, a.timeline_days, log)
        rollup_figures(url, log)
    if a.history_only:
        print(f"kept the database {url}")
        return 0

    base = tempfile.mkdtemp(prefix="gpueff-site-scale-", dir="/tmp")
    site, munged = start_site(base, url, forward_interval_s=a.interval, max_backoff_s=a.backoff)
    metrics_port = free_port()
    with open(site.config) as fh:
        text_cfg = fh.read()
    with open(site.config, "w") as fh:
        fh.write(text_cfg.replace("metrics_port = 0\n", f"metrics_port = {metrics_port}\n"))
    pid = site.start()
    # The nodes make their credentials with a munged of their own and run at nice 19: on a real site their
    # CPUs and munged are their own, and the service host's CPUs go to the service and PostgreSQL.
    node_munged, node_sock = start_node_munged(base, os.path.dirname(site.sock))
    service = {"api_url": f"http://127.0.0.1:{site.port}", "munge_socket": node_sock,
               "forward_interval_s": a.interval, "forward_max_backoff_s": a.backoff}
    for i in range(sz["nodes"]):
        spool.ensure_dirs(os.path.join(base, "nodes", node_name(i), "spool"))
    stop = mp.Event()
    per = -(-sz["nodes"] // a.procs)
    workers = [mp.Process(target=run_nodes, args=(f, min(per, sz["nodes"] - f), base, service, stop, CLUSTER, 19))
               for f in range(0, sz["nodes"], per)]
    for w in workers:
        w.start()
    time.sleep(a.interval + 2)
    running = Running(hist["first_id"], sz["running"], sz["nodes"], random.Random(3))
    try:
        steady(a, sz, url, base, running, hist, log, pid)
        pid = outage(a, sz, url, base, site, running, hist, log, [w.pid for w in workers if w.pid])
        passes(sz, url, base, running, log)
        reads(a, site, hist, sz["history"], metrics_port, log, base)
        log.figure("gpueff serve RSS", f"peak {rss_mb(pid, 'VmHWM'):.0f} MB, now {rss_mb(pid):.0f} MB", "", "<= 1 GiB")
    finally:
        stop.set()
        for w in workers:
            w.join(120)
        site.kill(signal.SIGTERM)
        munged.kill()
        node_munged.kill()
    print("\n| figure | measured | floor (same run) | goal |\n|---|---|---|---|")
    for row in log.rows:
        print("| " + " | ".join(row) + " |")
    if a.keep:
        print(f"kept {base} and the database {url}")
    else:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
