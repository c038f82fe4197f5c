"""Rollups computed in SQL equal a brute-force Python recomputation, on SQLite and real PostgreSQL."""

from __future__ import annotations

import math
import os
import random
from collections import defaultdict
from datetime import UTC, date, datetime, timedelta
from types import SimpleNamespace

import pytest
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlalchemy import insert, select, update

from slurm_gpueff.models import Job, RollupPending
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.slurm.sacct import parse_parsable
from slurm_gpueff.storage import migrate, rollups
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.enrich import backfill_jobs, enrich_jobs

NOW = datetime(2024, 3, 10, 12)


def random_jobs(n: int, seed: int) -> list[dict]:
    """``n`` job rows; about one in six is another run of an earlier row's job (runs -1 to 3, the negative one
    provisional), so that a requeued job counts once, as its last run."""
    rng = random.Random(seed)
    out: list[dict] = []
    runs: dict[tuple[str, int], set[int]] = {}
    for i in range(n):
        cluster, job_id, run = rng.choice(["c1", "c2"]), i + 1, 0
        if out and rng.random() < 0.15:
            earlier = rng.choice(out)
            free = sorted({-1, 0, 1, 2, 3} - runs[(earlier["cluster"], earlier["job_id"])])
            if free:
                cluster, job_id, run = earlier["cluster"], earlier["job_id"], rng.choice(free)
        runs.setdefault((cluster, job_id), set()).add(run)
        gh = rng.choice([None, rng.uniform(0, 50)])
        def part(p, gh=gh):  # noqa: ANN001
            return None if gh is None or rng.random() < p else gh * rng.random()
        out.append(dict(
            cluster=cluster, job_id=job_id, run=run, user=rng.choice(["ann", "bob", "cy", None]),
            account=rng.choice(["phys", "chem", None]), gpu_count=1, backend="none", record_source="hook",
            enriched=False,
            end_time=rng.choice([None, datetime(2023, 12, 20) + timedelta(seconds=rng.uniform(0, 80 * 86400))]),
            gpu_hours=gh, idle_gpu_hours=part(0.2), underfilled_gpu_hours=part(0.3), sm_active_gpu_hours=part(0.3),
            tensor_active_gpu_hours=part(0.5), energy_j=rng.choice([None, rng.uniform(0, 1e7)]),
            verdict=rng.choice(["healthy", "starved", "never_used", None]),
            analyzed_at=rng.choice([None, NOW - timedelta(days=3), NOW - timedelta(days=3)])))
    return out


def brute(jobs: list[dict], period: str, by: tuple[str, ...]) -> dict:
    """Plain-Python sums with SQL's NULL rules (a sum of nothing measured is None)."""
    acc: dict = defaultdict(lambda: defaultdict(list))
    last = {}
    for j in jobs:
        key = (j["cluster"], j["job_id"])
        last[key] = max(last.get(key, j["run"]), j["run"])
    for j in jobs:
        if j["end_time"] is None or j["analyzed_at"] is None:
            continue
        d = j["end_time"].date()
        start = d if period == "day" else date(d.year, d.month, 1)
        key = (start, j["cluster"], *[j[k] for k in by])
        a = acc[key]
        a["jobs"].append(int(j["run"] == last[(j["cluster"], j["job_id"])]))
        for m in ("gpu_hours", "idle_gpu_hours", "underfilled_gpu_hours", "sm_active_gpu_hours",
                  "tensor_active_gpu_hours", "energy_j"):
            a[m].append(j[m])
        for m, src in (("kernel_measured_gpu_hours", "idle_gpu_hours"),
                       ("sm_measured_gpu_hours", "sm_active_gpu_hours"),
                       ("tensor_measured_gpu_hours", "tensor_active_gpu_hours")):
            a[m].append(j["gpu_hours"] if j[src] is not None else None)
    out = {}
    for key, a in acc.items():
        row = {"jobs": sum(a["jobs"])}
        for m, vals in a.items():
            if m != "jobs":
                known = [v for v in vals if v is not None]
                row[m] = sum(known) if known else None
        out[key] = row
    return out


def close(a, b) -> bool:  # noqa: ANN001
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def check(engine, jobs) -> None:  # noqa: ANN001
    """Every grouping of the month rows, and of the day rows all but the verdict (day rows carry none: asking
    for them by verdict is refused, not answered with NULLs)."""
    with engine.connect() as conn:
        with pytest.raises(ValueError, match="not kept by verdict"):
            rollups.usage(conn, period="day", by="account_verdict")
        for period in ("day", "month"):
            for by, keys in (("user", ("user",)), ("account", ("account",)), ("site", ()),
                             ("account_verdict", ("account", "verdict"))):
                if period == "day" and by == "account_verdict":
                    continue
                want = brute(jobs, period, keys)
                got = {(r["period_start"], r["cluster"], *[r[k] for k in keys]): r
                       for r in rollups.usage(conn, period=period, by=by)}
                assert set(got) == set(want), (period, by)
                for key, w in want.items():
                    for m, v in w.items():
                        assert close(got[key][m], v), (period, by, key, m, got[key][m], v)


def run(url: str) -> None:
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    jobs = random_jobs(1500, seed=7)
    with engine.begin() as conn:
        conn.execute(insert(Job.__table__), jobs)
    res = rollups.refresh(engine, full=True, now=NOW)
    assert res.months == [date(2023, 12, 1), date(2024, 1, 1), date(2024, 2, 1), date(2024, 3, 1)]
    check(engine, jobs)

    # Incremental: re-analyse some January jobs with new figures; only January and the current month redo.
    t = Job.__table__
    later = NOW + timedelta(hours=5)
    changed = [j for j in jobs if j["end_time"] and j["end_time"].month == 1 and j["analyzed_at"]][:40]
    with engine.begin() as conn:
        for j in changed:
            j.update(gpu_hours=7.0, idle_gpu_hours=1.0, verdict="starved", analyzed_at=later)
            row = (t.c.cluster == j["cluster"], t.c.job_id == j["job_id"], t.c.run == j["run"])
            conn.execute(update(t).where(*row).values(
                gpu_hours=7.0, idle_gpu_hours=1.0, verdict="starved", analyzed_at=later))
    with engine.connect() as conn:
        assert rollups.dirty_months(conn, now=later) == [date(2024, 1, 1), date(2024, 3, 1)]
    rollups.refresh(engine, now=later)
    check(engine, jobs)
    with engine.connect() as conn:
        assert conn.execute(select(t.c.id)).first() is not None
    engine.dispose()


def test_rollups_equal_brute_force_on_sqlite(tmp_path):
    run(f"sqlite:///{tmp_path}/r.db")


@pytest.mark.postgres
def test_rollups_equal_brute_force_on_postgres(pg_url):  # noqa: F811
    run(pg_url)


# ------------------------------------------------------------------------- a job moved to another month
SACCT = os.path.join(os.path.dirname(__file__), "data", "sacct", "sacct-22.05-parsable.txt")
OCT, NOV = date(2026, 10, 1), date(2026, 11, 1)
SACCT_NOW = datetime(2026, 11, 22, 18)  # the captured sacct jobs ended on 2026-11-22 14:20 UTC


class Replay:
    """The enrich reader interface over sacct output captured from a real Slurm (as in test_enrich.py)."""

    batch_size = 2

    def __init__(self):
        with open(SACCT) as fh:
            self.by_id = {j.job_id: j for j in parse_parsable(fh.read(), delimiter="|")}

    def jobs(self, ids, cluster=None, runs=False):  # noqa: ANN001
        return [self.by_id[i] for i in ids if i in self.by_id]


def db_jobs(engine) -> list[dict]:  # noqa: ANN001
    with engine.connect() as conn:
        return [dict(r) for r in conn.execute(select(Job.__table__)).mappings()]


def pending(engine) -> list[date]:  # noqa: ANN001
    with engine.connect() as conn:
        return sorted(rollups._as_date(m) for (m,) in conn.execute(select(RollupPending.__table__.c.month)))


def month_jobs(engine, month: date) -> int:  # noqa: ANN001
    with engine.connect() as conn:
        return sum(r["jobs"] for r in rollups.usage(conn, by="site", start=month, end=rollups.next_month(month)))


def run_moved(url: str) -> None:
    """Enrichment (real code, captured sacct) moves two jobs from October to November; a plain refresh
    then gets both months right, as the brute-force recomputation over the job table says."""
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    jobs = random_jobs(400, seed=11)  # background: enriched and analysed, so neither step touches them
    for j in jobs:
        j.update(enriched=True, start_time=None, analyzed_at=NOW - timedelta(days=3))
    sacct = Replay().by_id
    analysed = SACCT_NOW - timedelta(days=2)
    for jid, days_off in ((11, 40), (14, 0), (19, 45), (15, 0)):  # the hooks got 11's and 19's end wrong
        end = datetime.fromtimestamp(sacct[jid].end, UTC).replace(tzinfo=None) - timedelta(days=days_off)
        jobs.append(dict(cluster="gpueffci", job_id=jid, run=0, user="alice", account="research", gpu_count=1,
                         backend="simulated", record_source="hook", enriched=False,
                         start_time=end - timedelta(hours=2), end_time=end, gpu_hours=2.0, idle_gpu_hours=0.5,
                         underfilled_gpu_hours=None, sm_active_gpu_hours=1.0, tensor_active_gpu_hours=None,
                         energy_j=1e6, verdict="healthy", analyzed_at=analysed))
    with engine.begin() as conn:
        conn.execute(insert(Job.__table__), jobs)
    rollups.refresh(engine, full=True, now=SACCT_NOW)
    check(engine, jobs)
    oct_before = month_jobs(engine, OCT)
    assert oct_before >= 2 and pending(engine) == []

    res = enrich_jobs(engine, Replay())
    assert (res.enriched, res.errors) == (4, [])
    moved = {j["job_id"]: j["end_time"] for j in db_jobs(engine) if j["cluster"] == "gpueffci"}
    assert {k: rollups.month_start(v) for k, v in moved.items()} == {11: NOV, 14: NOV, 19: NOV, 15: NOV}
    assert pending(engine) == [OCT]  # 11's and 19's old month; 14 and 15 did not change month

    # Plain refresh: October is recomputed although no job in it was analysed since the last refresh.
    later = SACCT_NOW + timedelta(hours=1)
    with engine.connect() as conn:
        assert rollups.dirty_months(conn, now=later) == [OCT, NOV]
    assert rollups.refresh(engine, now=later).months == [OCT, NOV]
    check(engine, db_jobs(engine))
    assert month_jobs(engine, OCT) == oct_before - 2 and pending(engine) == []

    # The summaries are redone (real code); the next plain refresh puts the jobs in November.
    assert summarize_pending(engine) == 4
    rollups.refresh(engine, now=later + timedelta(hours=1))
    after = db_jobs(engine)
    assert all(j["analyzed_at"] is not None for j in after if j["cluster"] == "gpueffci")
    check(engine, after)
    assert month_jobs(engine, NOV) == 4 and month_jobs(engine, OCT) == oct_before - 2
    with engine.connect() as conn:
        assert rollups.dirty_months(conn, now=later + timedelta(hours=2)) == [NOV]  # nothing pending any more
    engine.dispose()


def run_note_moved(url: str) -> None:
    """note_moved is idempotent and ignores None; a crashed refresh leaves its month pending; a full
    refresh clears every month it recomputed."""
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        rollups.note_moved(conn, [])
        rollups.note_moved(conn, [None, datetime(2024, 1, 31, 23, 59), datetime(2024, 1, 2), datetime(2023, 7, 4)])
    with engine.begin() as conn:  # already pending: no error, one row per month
        rollups.note_moved(conn, [datetime(2024, 1, 15), datetime(2024, 2, 1), None])
    assert pending(engine) == [date(2023, 7, 1), date(2024, 1, 1), date(2024, 2, 1)]

    with pytest.raises(RuntimeError), engine.begin() as conn:  # a refresh that dies mid-way
        rollups.refresh_month(conn, date(2024, 1, 1), NOW)
        raise RuntimeError("crash")
    assert pending(engine) == [date(2023, 7, 1), date(2024, 1, 1), date(2024, 2, 1)]

    assert rollups.refresh(engine, months=[date(2024, 2, 1)], now=NOW).months == [date(2024, 2, 1)]
    assert pending(engine) == [date(2023, 7, 1), date(2024, 1, 1)]
    res = rollups.refresh(engine, full=True, now=NOW)
    assert {date(2023, 7, 1), date(2024, 1, 1)} <= set(res.months) and pending(engine) == []
    engine.dispose()


def test_job_moved_by_enrichment_refreshes_its_old_month_on_sqlite(tmp_path):
    run_moved(f"sqlite:///{tmp_path}/m.db")


@pytest.mark.postgres
def test_job_moved_by_enrichment_refreshes_its_old_month_on_postgres(pg_url):  # noqa: F811
    run_moved(pg_url)


def test_note_moved_on_sqlite(tmp_path):
    run_note_moved(f"sqlite:///{tmp_path}/n.db")


@pytest.mark.postgres
def test_note_moved_on_postgres(pg_url):  # noqa: F811
    run_note_moved(pg_url)


class _OtherDialect:
    """A connection as a backend without ON CONFLICT would look to note_moved."""

    def __init__(self, conn):  # noqa: ANN001
        self.conn, self.dialect = conn, SimpleNamespace(name="other")

    def execute(self, *a):  # noqa: ANN002
        return self.conn.execute(*a)


def test_note_moved_without_on_conflict(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/o.db")
    with engine.begin() as conn:
        rollups.note_moved(_OtherDialect(conn), [datetime(2024, 1, 5), datetime(2024, 1, 6)])
    with engine.begin() as conn:
        rollups.note_moved(_OtherDialect(conn), [datetime(2024, 1, 7), datetime(2024, 3, 1), None])
    assert pending(engine) == [date(2024, 1, 1), date(2024, 3, 1)]
    engine.dispose()


def test_backfill_enriching_a_hook_record_notes_its_old_month(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path}/b.db")
    end = datetime(2026, 10, 3)  # the hook's end time; accounting says 2026-11-22
    with engine.begin() as conn:
        conn.execute(insert(Job.__table__), [dict(cluster="gpueffci", job_id=14, gpu_count=1, backend="simulated",
                                                  record_source="hook", enriched=False, end_time=end)])
    with open(SACCT) as fh:
        res = backfill_jobs(engine, parse_parsable(fh.read(), delimiter="|"), default_cluster="gpueffci")
    assert res.had_record == 1 and res.enriched == 1
    assert pending(engine) == [OCT]
    assert rollups.moved_month(end, datetime(2026, 10, 31)) is False and rollups.moved_month(None, end) is False
    assert rollups.moved_month(end, datetime(2026, 11, 1)) and rollups.moved_month(end, None)
    engine.dispose()
