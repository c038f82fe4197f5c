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
   database's growth over the measured half, per day. Before it, the site is primed as it stands once the
   service has run an alert window: every running job's live record stored and its GPUs' live samples of
   that window seeded, so the growth is measured at their bound, not while they fill;
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
import slurm_standin  # noqa: E402
import synthetic  # noqa: E402
from daemons import free_port  # noqa: E402
from pushsite import answered, cpu_s, fresh_pg, node_name, rss_mb, run_nodes, start_node_munged, start_site  # noqa: E402
from siterecords import Shapes  # noqa: E402

from slurm_gpueff import spool  # noqa: E402

FULL = {"nodes": 6250, "running": 25000, "ends_per_h": 6000, "history": 10_000_000, "backlog": 160_000,
        "heavy_user": 50_000, "heavy_account": 500_000, "accounts": 500, "users": 5000}
# Jobs as (nodes, GPUs on each): about 3.2 GPUs a job, one in ten on two nodes; every third an array task.
SHAPES = ((1, 1), (1, 1), (1, 1), (1, 2), (1, 2), (1, 4), (1, 4), (1, 8), (2, 4), (1, 1))
GPUS = tuple(n * g for n, g in SHAPES)
CLUSTER = "scale"
LIVE_PERIOD_S = 300.0  # [agent] live_interval_s, the default: one live record a running job every five minutes
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
    users = site_users(sz)
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
                jobs.append((jid, CLUSTER, jid, 0, f"job{jid % 97}", user, uid_of(user), account, "gpu", node,
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
        sent_log(conn, n, now, accounts)
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
    log.figure("database growth per day, estimated from the COPYed rows",
               f"{day / 1e9:.2f} GB/day at the full load: {jobs_day:,} jobs x "
               f"({per_job:,.0f} B a job with its GPU rows and indexes + {n_gpu / n:.1f} x {per_tl:,.0f} B a GPU "
               f"timeline of {TIMELINE_POINTS} points); the timelines' {tl_day / 1e9:.2f} GB/day are pruned after "
               "[service] timeline_retention_days; live rows are replaced, not added", "", "<= 2 GB/day")
    log.figure("history COPY", f"{n:,} jobs in {t_job:.1f} s ({n / t_job:,.0f}/s), {n_gpu:,} GPU rows in {t_gpu:.1f} s "
               f"({n_gpu / t_gpu:,.0f}/s), {n_tl:,} timelines in {t_tl:.1f} s; ANALYZE {t_an:.1f} s",
               "this is the COPY floor", "fast")
    return {"heavy_user": heavy_user, "heavy_account": heavy_account, "copy_rows_per_s": (n + n_gpu) / (t_job + t_gpu),
            "users": users, "home": home, "first_id": n + 1}


def sent_log(conn: Any, n: int, now: float, accounts: list[str]) -> None:
    """The reports' sent-log of a site whose service has run all year: the cards of the history's jobs that
    are still in ``[reports] card_lookback_h``, and last month's summaries, were written (dry run, as the
    bench's service runs), each card at the pass after its job's end, up to the rate limit of cards a user a
    day (the others skipped, as the service skips them). Without it the service's first card pass would
    render 48 hours of history's cards at once, and its start would write last month's summaries, which a
    running site did on the 1st; the monthly pass is timed on its own below (its rows deleted first)."""
    from slurm_gpueff.config import Config

    rep = Config({}).reports
    lookback, most = rep.card_lookback_h * 3600, rep.card_max_per_user_per_day
    first = max(1, int(n - (lookback + 600) * n / (365 * DAY)) - 1)  # ids are in end-time order
    at = datetime.fromtimestamp(now, UTC).replace(tzinfo=None)
    month = (at.replace(day=1) - timedelta(days=1)).strftime("%Y-%m")
    with conn.cursor() as cur:
        due = " AND verdict IS NOT NULL AND verdict <> 'healthy'" if rep.card_only_unhealthy else ""
        carded = cur.execute(f'SELECT id, "user", end_time FROM job WHERE id >= %s AND gpu_hours >= %s{due} '
                             "ORDER BY id", (first, rep.card_min_gpu_hours)).fetchall()
        written: dict[str, list[datetime]] = {}  # user -> when each card was written: the rate limit's count
        with cur.copy('COPY report_log (kind, subject, dry_run, job_pk, "user", recipients, status, reason, '
                      "attempts, created_at, sent_at) FROM STDIN") as cp:
            for jid, user, end in carded:
                when = end + timedelta(minutes=5)  # the next card pass after the job's end
                mine = written.setdefault(user, [])
                if most and sum(1 for t in mine[-most:] if t > when - timedelta(hours=24)) >= most:
                    cp.write_row(("card", f"{CLUSTER}:{jid}", True, jid, user, f"{user}@site", "skipped",
                                  f"rate limit: {most} cards per user per day", 0, when, None))
                    continue
                mine.append(when)
                cp.write_row(("card", f"{CLUSTER}:{jid}", True, jid, user, f"{user}@site", "dry-run", None, 1,
                              when, when))
        with cur.copy("COPY report_log (kind, subject, dry_run, recipients, status, attempts, created_at, sent_at) "
                      "FROM STDIN") as cp:
            for label in [*accounts, "*"]:
                cp.write_row(("monthly", f"{month}:{label}", True, "lead@site", "dry-run", 1, at, at))
    conn.commit()


def reused_history(url: str, sz: dict[str, int], log: Log) -> dict[str, Any]:
    """What :func:`history` returns, for the database an earlier run made (``--reuse``): the same users and
    accounts; the running jobs take ids above every job there (the earlier run's included)."""
    from sqlalchemy import create_engine, text

    users = site_users(sz)
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


READER = "gpuser"  # the heavy user: an ordinary account of this machine, which reads through the privacy path


def site_users(sz: dict[str, int]) -> list[str]:
    return [READER] + [f"u{i:05d}" for i in range(1, sz["users"])]


def uid_of(user: str) -> int:
    import pwd

    if user == READER:
        return pwd.getpwnam(READER).pw_uid
    return 20000 + int(user[1:])


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
    """The jobs running now: id -> (first node, nodes, GPUs on each, start, array (job, task) or None); finals
    replace them with new ones. ``slurm`` is the site as the Slurm stand-ins see it (running jobs and the last
    two hours' ended ones), written to their state file by :meth:`publish`."""

    def __init__(self, first_id: int, n: int, nodes: int, rng: random.Random, hist: dict[str, Any]) -> None:
        self.rng, self.nodes, self.next_id, self.hist = rng, nodes, first_id, hist
        self.jobs: dict[int, tuple[int, int, int, float, tuple[int, int] | None]] = {}
        self.slurm: dict[str, list[Any]] = {}
        self.lock = threading.Lock()
        now = time.time()
        for _ in range(n):
            self.add(now - rng.uniform(60, 8 * 3600))

    def owner(self, jid: int) -> tuple[str, str]:
        users = self.hist["users"]
        user = users[1 + jid % (len(users) - 1)]
        return user, self.hist["home"][user]

    def add(self, start: float) -> int:
        jid = self.next_id
        self.next_id += 1
        n_nodes, per = SHAPES[jid % len(SHAPES)]
        array = (jid - jid % 3 + 1, jid % 3) if jid % 3 == 0 else None
        first = self.rng.randrange(self.nodes - n_nodes + 1)
        self.jobs[jid] = (first, n_nodes, per, start, array)
        user, account = self.owner(jid)
        nodelist = ",".join(node_name(first + k) for k in range(n_nodes))
        with self.lock:
            self.slurm[str(jid)] = [user, account, "gpu", nodelist, n_nodes * per, start, None,
                                    array[0] if array else None, array[1] if array else None]
        return jid

    def end(self, jid: int, at: float) -> tuple[int, int, int, float, tuple[int, int] | None]:
        job = self.jobs.pop(jid)
        with self.lock:
            self.slurm[str(jid)][6] = at
        return job

    def publish(self, path: str, now: float) -> None:
        with self.lock:
            for k in [k for k, v in self.slurm.items() if v[6] is not None and v[6] < now - 7200]:
                del self.slurm[k]
            jobs = dict(self.slurm)
        slurm_standin.write_state(path, CLUSTER, jobs)


def records_of(shapes: Shapes, running: Running, jid: int, job: tuple[int, int, int, float, tuple[int, int] | None],
               end: float, live: bool) -> list[tuple[int, dict[str, Any]]]:
    """The job's records, one per node, as each node's Epilog (or live snapshot) writes it."""
    first, n_nodes, per, start, array = job
    user, account = running.owner(jid)
    return [(first + k, shapes.record(jid, cluster=CLUSTER, node=node_name(first + k), gpus=per, start=start,
                                      end=end, user=user, uid=uid_of(user), account=account, live=live,
                                      array=array))
            for k in range(n_nodes)]


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


def push_split(base: str, since: float, until: float) -> str:
    """The lag of the records pushed between ``since`` and ``until`` split in two, from the nodes' push traces
    (pushsite.trace_pushes): how long each record had waited on its node when its push was sent (the
    forwarder's interval, its turn after "busy", and the node's own CPU), and how long the pushes took in the
    service (the credential, a push slot, the store, the answer)."""
    waits: list[float] = []
    took: dict[str, list[float]] = {}
    for name in os.listdir(base):
        if not (name.startswith("pushes-") and name.endswith(".tsv")):
            continue
        with open(os.path.join(base, name)) as fh:
            for line in fh:
                f = line.rstrip("\n").split("\t")
                if len(f) != 4 or not since <= float(f[0]) <= until:
                    continue
                took.setdefault(f[2], []).append(float(f[1]) - float(f[0]))
                if f[2] == "200" and f[3]:
                    waits.extend(float(w) for w in f[3].split(","))
    waits.sort()
    ok = sorted(took.get("200", []))
    failed = Counter({k: len(v) for k, v in took.items() if k.startswith("-")})
    other = ", ".join(f"{len(v):,} answered {k}" for k, v in sorted(took.items()) if k != "200" and k not in failed)
    if failed:
        other += (", " if other else "") + f"{failed.total():,} not answered (" + "; ".join(
            f"{n:,}x {k[2:]}" for k, n in failed.most_common(3)) + ")"
    return (f"on the node before its push: p50 {q(waits, 0.5):.1f} s, p99 {q(waits, 0.99):.1f} s over {len(waits):,} "
            f"records; a push in the service: p50 {q(ok, 0.5):.2f} s, p99 {q(ok, 0.99):.2f} s, max "
            f"{ok[-1] if ok else float('nan'):.2f} s over {len(ok):,} pushes stored{'; ' + other if other else ''}")


GROWTH_TABLES = ("job", "job_gpu", "job_gpu_timeline", "live_sample", "rollup_pending", "usage_rollup", "report_log",
                 "alert_log")


class Growth:
    """The database's size through the steady load, sampled: the whole database, each table's heap, indexes
    and TOAST, its updates and how many were HOT, its dead rows, autovacuum's passes, the live samples."""

    def __init__(self, url: str, log: Log) -> None:
        import psycopg

        self.conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
        self.log = log
        self.samples: list[dict[str, Any]] = []

    def sample(self) -> dict[str, Any]:
        row: dict[str, Any] = {"t": time.time(), "db": self.conn.execute(
            "SELECT pg_database_size(current_database())").fetchone()[0]}
        for name, heap, idx, toast, upd, hot, dead, av in self.conn.execute(
                "SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid), "
                "coalesce(pg_total_relation_size(nullif(c.reltoastrelid, 0)), 0), s.n_tup_upd, s.n_tup_hot_upd, "
                "s.n_dead_tup, s.autovacuum_count FROM pg_class c JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE c.relname = ANY(%s)", (list(GROWTH_TABLES),)).fetchall():
            row[name] = (heap, idx, toast, upd, hot, dead, av)
        row["live_samples"] = self.conn.execute("SELECT count(*) FROM live_sample").fetchone()[0]
        self.samples.append(row)
        j, g = row.get("job", (0,) * 7), row.get("job_gpu", (0,) * 7)
        self.log.say(f"growth: database {row['db'] / 1e6:,.1f} MB; job heap {j[0] / 1e6:,.1f} + indexes "
                     f"{j[1] / 1e6:,.1f} MB ({j[5]:,} dead, {j[6]} autovacuums); job_gpu heap {g[0] / 1e6:,.1f} + "
                     f"indexes {g[1] / 1e6:,.1f} MB ({g[5]:,} dead); live samples {row['live_samples']:,}")
        return row

    def rate(self, since: float) -> tuple[float, float]:
        """Bytes per second of the whole database over the samples after ``since`` (a least-squares line),
        and the seconds they span."""
        pts = [(r["t"], r["db"]) for r in self.samples if r["t"] >= since]
        if len(pts) < 2:
            return float("nan"), 0.0
        mt = sum(t for t, _ in pts) / len(pts)
        mb = sum(b for _, b in pts) / len(pts)
        den = sum((t - mt) ** 2 for t, _ in pts)
        return sum((t - mt) * (b - mb) for t, b in pts) / den, pts[-1][0] - pts[0][0]

    def by_table(self, since: float) -> str:
        """Each table's growth (heap, indexes and TOAST) between the first sample after ``since`` and the last."""
        pts = [r for r in self.samples if r["t"] >= since]
        if len(pts) < 2:
            return "n/a"
        a, b = pts[0], pts[-1]
        grew = sorted(((sum(b[t][:3]) - sum(a[t][:3]), t) for t in GROWTH_TABLES if t in a and t in b), reverse=True)
        return ", ".join(f"{t} {d / 1e6:+,.1f} MB" for d, t in grew)

    def hot(self, table: str, since: float) -> str:
        pts = [r[table] for r in self.samples if r["t"] >= since and table in r]
        if len(pts) < 2:
            return "n/a"
        upd, hot = pts[-1][3] - pts[0][3], pts[-1][4] - pts[0][4]
        return f"{table} {upd:,} updates, {100 * hot / upd if upd else 0:.0f} % HOT"

    def bloat(self) -> str:
        """pgstattuple's approximate dead and free space of the updated tables, and the job indexes' density."""
        parts = []
        try:
            self.conn.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
            for t in ("job", "job_gpu", "job_gpu_timeline"):
                size, dead, free = self.conn.execute(
                    "SELECT table_len, dead_tuple_percent, approx_free_percent FROM pgstattuple_approx(%s)",
                    (t,)).fetchone()
                parts.append(f"{t} {size / 1e6:,.0f} MB: {dead:.1f} % dead, {free:.1f} % free")
            dens = self.conn.execute(
                "SELECT i.indexrelid::regclass::text, (pgstatindex(i.indexrelid::regclass)).avg_leaf_density "
                "FROM pg_index i WHERE i.indrelid = 'job'::regclass ORDER BY 1").fetchall()
            parts.append("job index leaf density " + ", ".join(f"{n} {d:.0f} %" for n, d in dens))
        except Exception as exc:  # noqa: BLE001 - a figure the bench could not read is said, not fatal
            parts.append(f"pgstattuple: {exc}")
        return "; ".join(parts)

    def close(self) -> None:
        self.conn.close()


def prime(a: argparse.Namespace, url: str, base: str, running: Running, shapes: Shapes, log: Log) -> None:
    """The site as it stands once the service has run a window: every running job's live record stored, and
    each of its GPUs' live samples of the last ``[alerts] window_min`` (the default, 60 min), as the alert pass
    stores them: one a pass (``[alerts] interval_s``), or one a live record where those are rarer. A service
    that has just started holds none and fills them over the first window; seeded, the steady load's growth
    is measured at their bound from its start. The samples are the job's figures behind its newest record
    (its activity constant), and only where the job had started."""
    import psycopg

    from slurm_gpueff.config import AlertsConfig

    w = Writer(base)
    t0 = time.time()
    for jid, job in list(running.jobs.items()):
        for node, rec in records_of(shapes, running, jid, job, t0, True):
            w.write(node, rec)
    written = len(w.pending)
    while w.pending and time.time() - t0 < 900:
        w.poll()
        time.sleep(0.5)
    stored_s = time.time() - t0
    alerts = AlertsConfig()
    step = max(a.live_period, alerts.interval_s)  # the pass stores a GPU's figures once a pass, if they moved
    per_window = int(alerts.window_min * 60 // step)
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        seeded = conn.execute(
            "INSERT INTO live_sample (job_pk, node, gpu_index, as_of, covered_s, kernel_s, sm_s) "
            "SELECT g.job_pk, g.node, g.gpu_index, j.end_time - make_interval(secs => k * %(p)s), "
            "c.cov - k * %(p)s, g.kernel_active * (c.cov - k * %(p)s), g.sm_active * (c.cov - k * %(p)s) "
            "FROM job j JOIN job_gpu g ON g.job_pk = j.id CROSS JOIN generate_series(1, %(n)s) AS k "
            "CROSS JOIN LATERAL (SELECT coalesce(g.measured_s, extract(epoch FROM g.end_time - g.start_time)) "
            "AS cov) AS c WHERE j.record_source = 'live' AND c.cov - k * %(p)s > 0 ON CONFLICT DO NOTHING",
            {"p": step, "n": per_window}).rowcount
        conn.execute("ANALYZE live_sample")
        n = conn.execute("SELECT count(*) FROM live_sample").fetchone()[0]
    log.say(f"primed: {written:,} live records of the {len(running.jobs):,} running jobs stored in {stored_s:.0f} s "
            f"({len(w.pending)} not acknowledged); {seeded:,} live samples seeded ({per_window} a GPU at most, "
            f"{step:g} s apart, behind each job's newest record), {n:,} in all")


def steady(a: argparse.Namespace, sz: dict[str, int], url: str, base: str, running: Running, shapes: Shapes,
           state: str, log: Log, site_pid: int) -> Writer:
    """The load for ``a.steady`` seconds: live records every ``a.live_period`` per running job, finals at the
    hourly rate; the database's growth sampled every ``a.sample_s`` throughout."""
    w = Writer(base)
    stop = threading.Event()
    growth = Growth(url, log)

    def poller() -> None:
        last_pub = last_sample = 0.0
        while not stop.is_set():
            w.poll()
            now = time.time()
            if now - last_pub >= 5:
                running.publish(state, now)
                last_pub = now
            if now - last_sample >= a.sample_s:
                growth.sample()
                last_sample = now
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
    half_at, cpu0 = t0 + a.steady / 2, service_cpu_s(site_pid)
    prof: Profile | None = None
    ends, lives = 0, 0
    next_live, next_end = t0, t0
    while (now := time.time()) - t0 < a.steady:
        if prof is None and now >= half_at:
            prof = Profile(a.profile, "steady load", site_pid, log)
        while next_live <= now:
            if not order:
                order = list(running.jobs)
                rng.shuffle(order)
            jid = order.pop()
            if jid in running.jobs:
                for node, rec in records_of(shapes, running, jid, running.jobs[jid], now, True):
                    w.write(node, rec)
                lives += 1
            next_live += 1.0 / live_rate
        while next_end <= now:
            jid = rng.choice(list(running.jobs)) if running.jobs else None
            if jid is not None:
                for node, rec in records_of(shapes, running, jid, running.end(jid, now), now, False):
                    w.write(node, rec)
                ends += 1
                running.add(now)
            next_end += 1.0 / end_rate
        time.sleep(0.02)
    deadline = time.time() + 3 * a.interval + 30
    while w.pending and time.time() < deadline:
        time.sleep(0.5)
    t_end = time.time()
    cpu = service_cpu_s(site_pid) - cpu0
    if prof is not None:
        prof.done()
    stop.set()
    th.join()
    growth.sample()
    lags = sorted(w.lags)
    log.figure("ingest lag at steady load", f"p50 {q(lags, 0.5):.1f} s, p99 {q(lags, 0.99):.1f} s, max "
               f"{lags[-1] if lags else float('nan'):.1f} s over {len(lags):,} records ({lives:,} live snapshots "
               f"of jobs, {ends:,} final; "
               f"{len(w.pending)} not acknowledged, {w.replaced} live snapshots replaced while waiting)",
               f"forward_interval_s {a.interval:g}", "p99 < 60 s")
    log.figure("ingest lag, split", push_split(base, t0, t_end), "", "-")
    log.figure("service CPU at steady load", f"{100 * cpu / (t_end - t0):.1f} % of one core "
               f"({1000 * cpu / max(1, len(lags)):.2f} ms per record), every task on", "", "-")
    third = t0 + 2 * a.steady / 3
    rate, span = growth.rate(third)
    first_rate, _ = growth.rate(t0)
    # The finals' own data grows with the end rate, which a smaller scale divides: projected to the full one
    # from this database's bytes per stored job (every table and index over every job row).
    n_jobs = growth.conn.execute("SELECT count(*) FROM job").fetchone()[0]
    per_job = growth.samples[-1]["db"] / max(1, n_jobs)
    extra = (FULL["ends_per_h"] - sz["ends_per_h"]) * 24 * per_job
    # The running jobs' churn (dead versions until autovacuum, live samples up to their window) scales with
    # the live updates a second, which a smaller scale (or a shorter live period) changes too: the whole rate
    # times their ratio is the projection that assumes nothing about which part has settled.
    linear = rate * DAY * (FULL["running"] / LIVE_PERIOD_S) / live_rate
    recent = [r["live_samples"] for r in growth.samples if r["t"] >= third]
    log.figure("database growth at steady load", f"{rate * DAY / 1e9:.2f} GB/day over the last third "
               f"({span:.0f} s; over the whole run {first_rate * DAY / 1e9:.2f} GB/day) at {live_rate:.0f} live "
               f"updates/s and {sz['ends_per_h']:,} ends/h; at the full {FULL['ends_per_h']:,} ends/h, "
               f"+{extra / 1e9:.2f} GB/day of finished jobs' data ({per_job:,.0f} B a job here) = "
               f"{(rate * DAY + extra) / 1e9:.2f} GB/day; all of it scaled by live updates/s to the full "
               f"{FULL['running'] / LIVE_PERIOD_S:.0f}/s, "
               f"{linear / 1e9:.2f} GB/day; live samples over the last third {min(recent, default=0):,} to "
               f"{max(recent, default=0):,} (bounded by [alerts] window_min); "
               f"{growth.hot('job', t0)}, {growth.hot('job_gpu', t0)}; "
               f"by table over the last third: {growth.by_table(third)}; "
               f"live samples {growth.samples[-1]['live_samples']:,} (max "
               f"{max(r['live_samples'] for r in growth.samples):,}); {growth.bloat()}", "", "<= 2 GB/day")
    growth.close()
    return w


class Memory:
    """The service's RSS, with its children's, sampled every few seconds through the run (the site's process
    of the moment: it is replaced at the outage), the largest per stage: where the peak the end reports was."""

    def __init__(self, site: Any) -> None:
        self.site, self.stage = site, "start"
        self.peaks: dict[str, float] = {}
        self.stop = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while not self.stop.wait(5.0):
            try:
                pid = self.site.proc.pid
                mb = rss_mb(pid) + sum(rss_mb(k) for k in children(pid))
            except OSError:
                continue
            self.peaks[self.stage] = max(self.peaks.get(self.stage, 0.0), mb)

    def said(self) -> str:
        return ", ".join(f"{k} {v:.0f} MB" for k, v in self.peaks.items())


def children(pid: int) -> list[int]:
    """The child processes of ``pid``."""
    out: list[int] = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as fh:
            out += [int(c) for c in fh.read().split()]
    return out


def service_cpu_s(pid: int) -> float:
    """CPU seconds of the service and of its child processes now (its chart process)."""
    return cpu_s(pid) + sum(cpu_s(k) for k in children(pid))


def stop_timeout_s() -> float:
    """etc/gpueff-serve.service's TimeoutStopSec: how long systemd lets the service finish its tasks."""
    with open(os.path.join(_ROOT, "etc", "gpueff-serve.service")) as fh:
        m = re.search(r"^TimeoutStopSec=(\d+)$", fh.read(), re.M)
    return float(m.group(1)) if m else 90.0  # systemd's default


def stop_service(site: Any) -> str:
    """Stopped as systemd stops it: SIGTERM, then SIGKILL after the unit's TimeoutStopSec; says how it went."""
    proc = site.proc
    if proc is None or proc.poll() is not None:
        return "it was not running"
    limit = stop_timeout_s()
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(limit)
        return f"SIGTERM: it finished its running tasks and exited in {time.time() - t0:.1f} s"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(60)
        return (f"SIGTERM: still running after TimeoutStopSec={limit:.0f} s, killed (SIGKILL) as systemd "
                "would")


def quarantine_count(base: str) -> str:
    """Entries quarantined by the service's ingest and by the nodes' forwarders (their ``.error`` files aside)."""
    def count(spool_dir: str) -> int:
        d = spool.quarantine_dir(spool_dir)
        return sum(1 for f in os.listdir(d) if not f.endswith(spool.ERROR)) if os.path.isdir(d) else 0

    nodes = sum(count(os.path.join(base, "nodes", d, "spool")) for d in os.listdir(os.path.join(base, "nodes")))
    return f"quarantined: {count(os.path.join(base, 'service', 'spool'))} by the service, {nodes} on the nodes"


def outage(a: argparse.Namespace, sz: dict[str, int], url: str, base: str, site: Any, running: Running,
           shapes: Shapes, hist: dict[str, Any], log: Log, nodes: list[int]) -> int:
    """Stop the service, write the backlog, start it, time the drain; count by key."""
    from sqlalchemy import create_engine

    log.say(f"outage: service stopped ({stop_service(site)})")
    w = Writer(base)
    now = time.time()
    finals: set[int] = set()
    n_live = 0
    for jid, job in list(running.jobs.items()):  # each running job's newest snapshot
        for node, rec in records_of(shapes, running, jid, job, now, True):
            w.write(node, rec)
            n_live += 1
    n_final = 0
    while n_live + n_final < sz["backlog"]:  # the jobs that ended in the hour
        jid = running.add(now - 3600 - random.uniform(0, 3600))
        end = now - random.uniform(0, 3600)
        for node, rec in records_of(shapes, running, jid, running.end(jid, end), end, False):
            w.write(node, rec)
            n_final += 1
        finals.add(jid)
    n = n_live + n_final
    log.say(f"outage: backlog of {n:,} records written ({n_live:,} live records of the running jobs' nodes, "
            f"{n_final:,} final records of {len(finals):,} jobs) in {time.time() - now:.0f} s; the service comes back")
    running.publish(os.path.join(base, "slurm", "state.json"), time.time())
    t0 = time.time()
    with open(site.log) as fh:
        log_from = len(fh.read())
    nodes_cpu0 = sum(cpu_s(p) for p in nodes)
    pid = site.start()
    prof = Profile(a.profile, "drain", pid, log)
    import psycopg

    conn = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True)
    ids = sorted(finals)
    t_stored = t_analysed = None
    drain = None
    while time.time() - t0 < a.drain_limit and (w.pending or t_stored is None or t_analysed is None):
        w.poll()
        if not w.pending and drain is None:
            drain = time.time() - t0
        stored, analysed = conn.execute(  # the backlog's finished jobs: stored as final, and analysed
            "SELECT count(*), count(analyzed_at) FROM job WHERE cluster = %s AND job_id = ANY(%s) "
            "AND record_source <> 'live'", (CLUSTER, ids)).fetchone()
        if t_stored is None and stored >= len(ids):
            t_stored = time.time() - t0
        if t_analysed is None and analysed >= len(ids):
            t_analysed = time.time() - t0
        time.sleep(2.0)
    conn.close()
    drain = drain if drain is not None else time.time() - t0
    prof.done()
    cpu_note = (f"CPU over the drain: the service {service_cpu_s(pid):.0f} s (with its chart process), the simulated "
                f"nodes {sum(cpu_s(p) for p in nodes) - nodes_cpu0:.0f} s (all on this machine, beside PostgreSQL)")
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
    quarantined = quarantine_count(base)
    log.figure("1-hour backlog stored and analysed", f"its {len(finals):,} finished jobs all stored as final "
               + (f"{t_stored:.0f} s" if t_stored is not None else f"NOT within {a.drain_limit:.0f} s")
               + " and all analysed (in reports) "
               + (f"{t_analysed:.0f} s" if t_analysed is not None else f"NOT within {a.drain_limit:.0f} s")
               + f" after the service's start; {quarantined}", "", "<= 5 min stored, <= 15 min analysed")
    log.figure("1-hour backlog drained", f"{n:,} records in {drain:.0f} s ({n / drain:,.0f}/s) from the service's "
               f"start, nodes backing off up to {a.backoff:g} s; {counted.line()}; {len(w.pending)} files left; "
               f"{service_side}; {cpu_note}",
               f"COPY {hist['copy_rows_per_s']:,.0f} rows/s" if hist["copy_rows_per_s"] else "",
               "<= 5 min, 0 lost, 0 duplicated")
    log.figure("backlog drain, split", push_split(base, t0, t0 + drain), "", "-")
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
def passes(sz: dict[str, int], url: str, base: str, running: Running, log: Log) -> None:
    """The service's passes once more in this process, timed, through the Slurm stand-ins (real programs)."""
    from sqlalchemy import text

    from slurm_gpueff.service.alerts import run_alerts
    from slurm_gpueff.slurm.sacct import SacctReader
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.enrich import enrich_jobs

    cfg = _pass_config(base, url)
    eng = make_engine(url, create=False)
    running.publish(os.path.join(base, "slurm", "state.json"), time.time())
    n_live = len(running.jobs)
    calls0 = squeue_calls(base)
    t0 = time.perf_counter()
    res = run_alerts(eng, cfg, dry_run=True)  # squeue: the stand-in program, in pieces of ids (slurm/runner.py)
    alerts_s = time.perf_counter() - t0
    calls = squeue_calls(base) - calls0
    with eng.connect() as c:  # the floor: the running jobs' rows and their GPUs' rows read, nothing decided
        t0 = time.perf_counter()
        live = c.execute(text("SELECT * FROM job WHERE record_source = 'live'")).all()
        gpus = c.execute(text("SELECT g.* FROM job_gpu g JOIN job j ON j.id = g.job_pk "
                              "WHERE j.record_source = 'live'")).all()
        read_s = time.perf_counter() - t0
    squeue = os.path.join(base, "slurm", "squeue")
    ids = [str(i) for i in list(running.jobs)[:4000]]
    t0 = time.perf_counter()
    one = subprocess.run([squeue, "-h", "-a", "-j", ",".join(ids), "-O", "JobID:40,State:24"], capture_output=True,
                         check=False)
    one_s = time.perf_counter() - t0
    log.figure("idle-alert pass", f"{alerts_s:.1f} s over {res.judged:,} running jobs ({n_live:,} running in the "
               f"simulation; {len(res.actions)} actions, dry run; {len(res.errors)} errors"
               f"{': ' + res.errors[0][:200] if res.errors else ''}; squeue run {calls} times, a real program)",
               f"their {len(live):,} job rows and {len(gpus):,} GPU rows read alone: {read_s:.2f} s; the stand-in "
               f"squeue for 4,000 ids: {one_s:.2f} s ({len(one.stdout) / 1e3:.0f} kB)", "<= 30 s")

    # enrichment: the ended jobs not yet enriched, through the stand-in sacct (24.11's --json)
    exe = os.path.join(base, "slurm", "sacct")
    with eng.connect() as c:
        pending = int(c.execute(text("SELECT count(*) FROM job WHERE cluster = :c AND NOT enriched AND "
                                     "record_source = 'hook'"), {"c": CLUSTER}).scalar() or 0)
    reader = SacctReader(command=exe, timeout_s=120, batch_size=500, fmt="json")
    t0 = time.perf_counter()
    er = enrich_jobs(eng, reader, settle_s=0, limit=sz["ends_per_h"])
    enrich_s = time.perf_counter() - t0
    some = [str(j) for j in list(running.slurm)[:500]]
    t0 = time.perf_counter()
    out = subprocess.run([exe, "--json", "-X", "-D", "-j", ",".join(some)], capture_output=True, check=False)
    one_call = time.perf_counter() - t0
    if er.not_found:  # which jobs, and what the stand-in says of them
        with eng.connect() as c:
            missed = c.execute(text("SELECT job_id, run, start_time, end_time FROM job WHERE cluster = :c AND NOT "
                                    "enriched AND record_source <> 'live' ORDER BY id LIMIT 3"),
                               {"c": CLUSTER}).fetchall()
        said = subprocess.run([exe, "--json", "-X", "-D", "-j", ",".join(str(r[0]) for r in missed)],
                              capture_output=True, check=False, text=True)
        told = [(j["job_id"], j["time"]["start"], j["time"]["end"]) for j in json.loads(said.stdout or "{}")
                .get("jobs", [])]
        log.say(f"enrichment: not found, e.g. {[tuple(map(str, r)) for r in missed]}; the stand-in sacct for "
                f"them: {told}; its state holds {len(running.slurm):,} jobs")
    log.figure("enrichment pass", f"{enrich_s:.1f} s for {er.checked:,} jobs ({er.enriched:,} enriched, "
               f"{er.not_found} not found; {len(er.errors)} errors{': ' + er.errors[0] if er.errors else ''}; "
               f"{pending:,} were waiting; the service's own enrich task ran beside the load)",
               f"the stand-in sacct alone: {one_call:.2f} s a call of 500 ids ({len(out.stdout) / 1e6:.1f} MB)",
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
                 f'state_dir = "{base}/pass/run"\ndatabase = "{url}"\n[sacct]\ncommand = "{base}/slurm/sacct"\n'
                 f'[alerts]\nenabled = true\ndry_run = true\n'
                 f'[reports]\ndir = "{base}/pass/reports"\ncoordinators_as_leads = false\n')
    return load(path)


def squeue_calls(base: str) -> int:
    """How many times the stand-in squeue ran (its log: one line a call)."""
    path = os.path.join(base, "slurm", "calls.log")
    if not os.path.exists(path):
        return 0
    with open(path) as fh:
        return sum(1 for line in fh if line.startswith("squeue"))


# ------------------------------------------------------------------------------------------------ reads
def reads(a: argparse.Namespace, site: Any, hist: dict[str, Any], n_hist: int, metrics_port: int, log: Log,
          base: str) -> None:
    """seff-gpu as the heavy user, an ordinary account of this machine (READER), through the service and its
    privacy path: Debian's python3 with a copy of the package, as a login node's install, and a client config
    that names only the service and munged."""
    lib = os.path.join(base, "pylib")
    shutil.copytree(os.path.join(_ROOT, "slurm_gpueff"), os.path.join(lib, "slurm_gpueff"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    python = a.seff_python or "/usr/bin/python3"
    # Byte-compiled, as `pip install` leaves a package (a user cannot write beside it).
    subprocess.run([python, "-m", "compileall", "-q", lib], capture_output=True, check=True)
    client = os.path.join(base, "client.toml")
    with open(site.config) as fh:
        sock = re.search(r'^munge_socket = "(.*)"$', fh.read(), re.M).group(1)  # type: ignore[union-attr]
    with open(client, "w") as fh:
        fh.write(f'[site]\ncluster = "{CLUSTER}"\n[service]\napi_url = "http://127.0.0.1:{site.port}"\n'
                 f'munge_socket = "{sock}"\n')
    subprocess.run(["chmod", "-R", "a+rX", lib, client], check=True)  # base is 0755 (run())
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONPATH": lib,
           "GPUEFF_SEFF_VIA": "service", "GPUEFF_CONFIG": client}
    as_user = ["runuser", "-u", READER, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items())]
    seff = [*as_user, python, "-m", "slurm_gpueff.cli.seff"]

    def wall(cmd: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
        t = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        return time.perf_counter() - t, r

    rng = random.Random(5)
    bare = sorted(wall([*as_user, python, "-c", "pass"])[0] for _ in range(20))
    own = [j for j in range(200, n_hist + 1, 200)]  # the heavy user's jobs (history: every 200th)
    p50s, p99s, maxes, bad = [], [], [], 0
    for _round in range(a.seff_rounds):
        times = []
        for _ in range(a.seff_runs):
            dt, r = wall([*seff, str(rng.choice(own))])
            times.append(dt)
            bad += r.returncode != 0
            if r.returncode != 0 and bad == 1:
                log.say(f"seff-gpu failed: {r.stderr.strip()[:300]}")
        times.sort()
        p50s.append(q(times, 0.5))
        p99s.append(q(times, 0.99))
        maxes.append(times[-1])
        log.say(f"seff-gpu round {_round + 1}: p50 {1000 * p50s[-1]:.0f} ms, p99 {1000 * p99s[-1]:.0f} ms, "
                f"max {1000 * maxes[-1]:.0f} ms over {len(times)}")

    def mmm(xs: list[float]) -> str:
        xs = sorted(xs)
        return f"{1000 * xs[0]:.0f} / {1000 * xs[len(xs) // 2]:.0f} / {1000 * xs[-1]:.0f}"

    users = hist["users"]
    stranger = next(j for j in range(1, n_hist) if j % 200  # a job of a user in another account than READER leads
                    and hist["home"][users[1 + j % (len(users) - 1)]] != hist["heavy_account"])
    other = subprocess.run([*seff, str(stranger)], capture_output=True, text=True, check=False)
    log.figure("seff-gpu JOBID as an ordinary user", f"p50 {mmm(p50s)} ms, p99 {mmm(p99s)} ms (min / median / max "
               f"of {a.seff_rounds} rounds of {a.seff_runs} of {READER}'s jobs; {bad} failed; job {stranger} of a user "
               f"{READER} may not see: exit {other.returncode}, {(other.stderr or other.stdout).strip()[:100]!r})",
               f"python3 -c pass as {READER} {1000 * q(bare, 0.5):.0f} ms ({python})", "p99 <= 300 ms")
    for flag, who, n in (("-u", hist["heavy_user"], "user"), ("-A", hist["heavy_account"], "account")):
        dt, r = wall([*seff, flag, who, "-S", (datetime.now() - timedelta(days=366)).strftime("%Y-%m-%d")])
        lines = r.stdout.count("\n")
        log.figure(f"seff-gpu {flag} (the heavy {n}) as {READER}", f"{dt:.2f} s, exit {r.returncode}, {lines} lines, "
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
def server_settings(url: str) -> str:
    """The server's settings that decide the database's growth and speed, for the log."""
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.connect() as c:
        out = ", ".join(f"{k} {c.execute(text(f'SHOW {k}')).scalar()}" for k in (
            "server_version", "autovacuum", "autovacuum_naptime", "autovacuum_vacuum_cost_limit", "fsync",
            "shared_buffers", "max_wal_size"))
    eng.dispose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--scale", type=float, default=1.0, help="of the full load (0.1: a tenth)")
    ap.add_argument("--quick", action="store_true", help="a hundredth, 30-s live period: under 5 minutes")
    ap.add_argument("--steady", type=float, help="seconds of steady load (default: two live periods)")
    ap.add_argument("--live-period", type=float, default=LIVE_PERIOD_S)
    ap.add_argument("--interval", type=float, default=15.0, help="[service] forward_interval_s (default 15)")
    ap.add_argument("--backoff", type=float, default=120.0,
                    help="[service] forward_max_backoff_s (default 120, the product's default)")
    ap.add_argument("--history", type=int, metavar="JOBS",
                    help="jobs of history instead of the scale's (a diagnostic run: its figures are not the scale's)")
    ap.add_argument("--timeline-days", type=float, default=7.0, help="history days that keep their timelines")
    ap.add_argument("--drain-limit", type=float, default=1800.0)
    ap.add_argument("--seff-runs", type=int, default=1000, help="seff-gpu JOBID samples a round (default 1000)")
    ap.add_argument("--seff-rounds", type=int, default=3, help="rounds of --seff-runs (default 3)")
    ap.add_argument("--sample-s", type=float, default=60.0, help="seconds between the database's size samples")
    ap.add_argument("--seff-python", help="the Python of a site install of slurm-gpueff to run seff-gpu with "
                    "(default: this one, with this checkout on its path)")
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--postgres", help="a PostgreSQL server's URL to use (postgresql+psycopg://USER@HOST:PORT/DB); "
                    "default: a private cluster of this machine's PostgreSQL with its own defaults (autovacuum on, "
                    "fsync on), as a site runs it, made and removed by the run")
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
        a.seff_runs = min(a.seff_runs, 100)
    a.steady = a.steady or 2 * a.live_period
    sz = sizes(a.scale)
    if a.history:
        sz["history"] = a.history
        sz["heavy_user"] = min(sz["heavy_user"], a.history // 200)
        sz["heavy_account"] = min(sz["heavy_account"], a.history)
    log = Log()
    log.say(f"scale {a.scale:g}: {json.dumps(sz)}")
    from slurm_gpueff.storage import migrate
    from slurm_gpueff.storage.db import make_engine

    if a.reuse and not a.postgres:
        ap.error("--reuse needs --postgres: the private cluster is made afresh each run")
    cluster = None
    if not a.postgres:  # the server as a site runs it: PostgreSQL's defaults (this machine's shared one has
        # autovacuum off, a CI setting; the database's growth would then be every dead row version kept)
        from pgutil import PrivateCluster

        cluster = PrivateCluster()
        cluster.start(durable=True)
        a.postgres = cluster.url
    try:
        return run(a, sz, log, migrate, make_engine)
    finally:
        if cluster is not None and not a.keep:
            cluster.destroy()
        elif cluster is not None:
            print(f"kept the PostgreSQL cluster in {cluster.base} (port {cluster.port}; stop: pg_ctl -D "
                  f"{cluster.data} stop)")


def run(a: argparse.Namespace, sz: dict[str, int], log: Log, migrate: Any, make_engine: Any) -> int:
    settings = server_settings(a.postgres)
    log.say(f"PostgreSQL: {settings}")
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
    os.chmod(base, 0o755)  # the ordinary user who reads (READER) reaches its client config here
    state = os.path.join(base, "slurm", "state.json")
    sacct = slurm_standin.install(os.path.join(base, "slurm"), state)
    slurm_standin.write_state(state, CLUSTER, {})
    # The service as deployed: every task on at its defaults (ingest, enrich, rollups, retention, the integrity
    # check), the idle-GPU policy and the job cards on (dry: decided, rendered and logged; nothing sent or
    # cancelled), Slurm's commands the stand-in programs; the heavy user leads the heavy account.
    service = (f'\n[sacct]\ncommand = "{sacct}"\n[alerts]\nenabled = true\ndry_run = true\n'
               f'[reports]\ndir = "{base}/reports"\ncards = true\nmonthly = true\n[mail]\ndry_run = true\n'
               f'[leads]\na000 = ["{READER}"]\n')
    site, munged = start_site(base, url, forward_interval_s=a.interval, max_backoff_s=a.backoff, service=service,
                              quiet=False, cluster=CLUSTER)
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
    workers = [mp.Process(target=run_nodes, args=(f, min(per, sz["nodes"] - f), base, service, stop, CLUSTER, 19,
                                                  True))
               for f in range(0, sz["nodes"], per)]
    for w in workers:
        w.start()
    time.sleep(a.interval + 2)
    shapes = Shapes()
    running = Running(hist["first_id"], sz["running"], sz["nodes"], random.Random(3), hist)
    running.publish(state, time.time())
    mem = Memory(site)
    try:
        mem.stage = "prime"
        prime(a, url, base, running, shapes, log)
        mem.stage = "steady"
        steady(a, sz, url, base, running, shapes, state, log, pid)
        mem.stage = "outage and drain"
        pid = outage(a, sz, url, base, site, running, shapes, hist, log, [w.pid for w in workers if w.pid])
        mem.stage = "passes"
        passes(sz, url, base, running, log)
        mem.stage = "reads"
        reads(a, site, hist, sz["history"], metrics_port, log, base)
        mem.stop.set()
        kids = children(pid)  # the service's chart process (reports/charts.py draw_apart)
        log.figure("gpueff serve RSS", f"peak {rss_mb(pid, 'VmHWM'):.0f} MB, now {rss_mb(pid):.0f} MB; its child "
                   f"processes peak {sum(rss_mb(k, 'VmHWM') for k in kids):.0f} MB, now "
                   f"{sum(rss_mb(k) for k in kids):.0f} MB ({len(kids)}); with them, sampled every 5 s, the "
                   f"largest by stage: {mem.said()}", "", "<= 1 GiB")
    finally:
        stop.set()
        for w in workers:
            w.join(120)
        stop_service(site)
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
