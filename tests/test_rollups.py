"""Rollups computed in SQL equal a brute-force Python recomputation, on SQLite and real PostgreSQL."""

from __future__ import annotations

import math
import random
from collections import defaultdict
from datetime import date, datetime, timedelta

import pytest
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlalchemy import insert, select, update

from slurm_gpueff.models import Job
from slurm_gpueff.storage import migrate, rollups
from slurm_gpueff.storage.db import make_engine

NOW = datetime(2024, 3, 10, 12)


def random_jobs(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        gh = rng.choice([None, rng.uniform(0, 50)])
        def part(p, gh=gh):  # noqa: ANN001
            return None if gh is None or rng.random() < p else gh * rng.random()
        out.append(dict(
            cluster=rng.choice(["c1", "c2"]), job_id=i + 1, user=rng.choice(["ann", "bob", "cy", None]),
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
    for j in jobs:
        if j["end_time"] is None or j["analyzed_at"] is None:
            continue
        d = j["end_time"].date()
        start = d if period == "day" else date(d.year, d.month, 1)
        key = (start, j["cluster"], *[j[k] for k in by])
        a = acc[key]
        a["jobs"].append(1)
        for m in ("gpu_hours", "idle_gpu_hours", "underfilled_gpu_hours", "sm_active_gpu_hours",
                  "tensor_active_gpu_hours", "energy_j"):
            a[m].append(j[m])
        for m, src in (("kernel_measured_gpu_hours", "idle_gpu_hours"),
                       ("sm_measured_gpu_hours", "sm_active_gpu_hours"),
                       ("tensor_measured_gpu_hours", "tensor_active_gpu_hours")):
            a[m].append(j["gpu_hours"] if j[src] is not None else None)
    out = {}
    for key, a in acc.items():
        row = {"jobs": len(a["jobs"])}
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
    with engine.connect() as conn:
        for period in ("day", "month"):
            for by, keys in (("user", ("user",)), ("account", ("account",)), ("site", ()),
                             ("account_verdict", ("account", "verdict"))):
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
            conn.execute(update(t).where(t.c.job_id == j["job_id"]).values(
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
