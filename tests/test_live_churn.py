"""The job table's indexes on end and analysis times hold finished jobs only (migration 0017): a running job's
live updates, which move both times, add no entry to them, and a table of a user's jobs still lists the
running ones beside the finished ones, each read through an index. Real PostgreSQL, migrated to the head."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlalchemy import event, text
from sqlalchemy.engine import Engine
from sqlmodel import Session

from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.summaries import list_jobs, table_totals

TIME_INDEXES = ("ix_job_end_time", "ix_job_user_end", "ix_job_account_end", "ix_job_analyzed_at")
T0 = datetime(2027, 3, 1)


def _site(url: str, finished: int, running: int) -> Engine:
    """``finished`` analysed jobs of 20 users over 30 days, then ``running`` live rows (the last ids)."""
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO job (id, cluster, job_id, run, gpu_count, backend, record_source, enriched, \"user\", "
            "account, state, start_time, end_time, analyzed_at, gpu_hours) "
            "SELECT i, 'c', i, 0, 1, 'nvml', CASE WHEN i > :f THEN 'live' ELSE 'hook' END, false, "
            "'u' || (i % 20), 'a' || (i % 5), CASE WHEN i > :f THEN 'RUNNING' ELSE 'COMPLETED' END, "
            "CAST(:t0 AS timestamp) + i * interval '10 seconds', "
            "CAST(:t0 AS timestamp) + i * interval '10 seconds' + interval '1 hour', now(), 1.0 "
            "FROM generate_series(1, CAST(:n AS integer)) i"), {"f": finished, "n": finished + running, "t0": T0})
        conn.execute(text("ANALYZE job"))
    return engine


def _pages(conn: Any, name: str) -> int:
    return int(conn.execute(text("SELECT pg_relation_size(CAST(:n AS regclass))"), {"n": name}).scalar())


def _users_table(engine: Engine, limit: int) -> tuple[list[Any], list[Any], dict[str, Any], list[tuple[str, Any]]]:
    """u7's table over 40 days as ``seff-gpu -u`` reads it: the newest ``limit`` lines, every line, the
    totals; with the SELECT statements run and their values."""
    ran: list[tuple[str, Any]] = []

    def keep(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if statement.lstrip().upper().startswith("SELECT"):
            ran.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", keep)
    window = {"user": "u7", "start": T0, "end": T0 + timedelta(days=40)}
    with Session(engine) as session:
        newest = list_jobs(session, limit=limit, **window)  # type: ignore[arg-type]
        every = list_jobs(session, **window)  # type: ignore[arg-type]
        totals = table_totals(session, **window)  # type: ignore[arg-type]
    event.remove(engine, "before_cursor_execute", keep)
    return newest, every, totals, ran


@pytest.mark.postgres
def test_a_running_jobs_updates_add_no_entry_to_the_time_indexes(pg_url):  # noqa: F811
    """30 rounds of every running job's two updates (its figures' time, then its analysis), as its live
    records make them. The four time indexes keep their size to the byte; an index on end time over every
    row, made here beside them as the schema had it, grows with the updates (what the test would see if the
    partial predicate were lost)."""
    engine = _site(pg_url, finished=20_000, running=2_000)
    with engine.begin() as conn:
        conn.execute(text("CREATE INDEX ix_probe_every_row ON job (end_time)"))
        before = {n: _pages(conn, n) for n in (*TIME_INDEXES, "ix_probe_every_row")}
    for _round in range(30):
        with engine.begin() as conn:
            conn.execute(text("UPDATE job SET end_time = end_time + interval '5 minutes', analyzed_at = NULL "
                              "WHERE record_source = 'live'"))
            conn.execute(text("UPDATE job SET analyzed_at = now() WHERE record_source = 'live'"))
    with engine.connect() as conn:
        after = {n: _pages(conn, n) for n in before}
        defs = dict(conn.execute(text("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'job'")).all())
    assert {n: after[n] for n in TIME_INDEXES} == {n: before[n] for n in TIME_INDEXES}, (before, after)
    assert after["ix_probe_every_row"] > 2 * before["ix_probe_every_row"], (before, after)
    for name in TIME_INDEXES:
        assert "WHERE ((record_source)::text <> 'live'::text)" in defs[name], defs[name]
    engine.dispose()


@pytest.mark.postgres
def test_a_users_table_lists_running_and_finished_jobs_each_through_an_index(pg_url):  # noqa: F811
    """``seff-gpu -u`` over a month: the user's newest lines and the totals hold both the finished jobs and
    the running ones; the statements, explained with the values they ran with, read the finished jobs
    through one of the finished jobs' indexes (ix_job_user_end, or ix_job_end_time walked from the newest
    for the newest lines) and the running ones through ix_job_live, never the whole table."""
    engine = _site(pg_url, finished=100_000, running=2_000)
    newest, every, totals, ran = _users_table(engine, 50)
    # u7: ids 7, 27, ...: 5,000 finished (ids up to 100,000), 100 running (the last 2,000 ids); the
    # running ones have the latest end times.
    assert len(every) == 5_100 and sum(j.state == "RUNNING" for j in every) == 100
    assert [j.job_id for j in newest] == [j.job_id for j in every[-50:]]
    assert all(j.state == "RUNNING" for j in newest)
    assert totals["rows"] == 5_100
    plans = []
    with engine.connect() as conn:
        for statement, parameters in ran:
            plans.append("\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN {statement}", parameters)))
    assert len(plans) == 3, ran
    for plan in plans:
        finished = "ix_job_user_end" in plan or "ix_job_end_time" in plan
        assert finished and "ix_job_live" in plan and "Seq Scan on job" not in plan, plan
    engine.dispose()


def test_on_sqlite_a_users_table_reads_its_lines_through_the_indexes_too(tmp_path):
    """SQLite uses a partial index only where the query's WHERE holds its predicate as a term of its own: the
    table's lines are a union of the finished jobs (the partial indexes by end time) and the running ones
    (ix_job_live), each statement explained here with the values it ran with: no scan of the job table."""
    engine = make_engine(f"sqlite:///{tmp_path / 'gpueff.db'}")
    with engine.begin() as conn:
        conn.execute(text(
            "WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < 20000) "
            "INSERT INTO job (id, cluster, job_id, run, gpu_count, backend, record_source, enriched, user, account, "
            "state, start_time, end_time, analyzed_at, gpu_hours) "
            "SELECT i, 'c', i, 0, 1, 'nvml', CASE WHEN i > 19000 THEN 'live' ELSE 'hook' END, 0, 'u' || (i % 20), "
            "'a' || (i % 5), CASE WHEN i > 19000 THEN 'RUNNING' ELSE 'COMPLETED' END, "
            "datetime('2027-03-01', '+' || (i * 10) || ' seconds'), "
            "datetime('2027-03-01', '+' || (i * 10 + 3600) || ' seconds'), datetime('now'), 1.0 FROM s"))
        conn.execute(text("ANALYZE"))
    newest, every, totals, ran = _users_table(engine, 20)
    assert len(every) == 1_000 and sum(j.state == "RUNNING" for j in every) == 50 and totals["rows"] == 1_000
    assert [j.job_id for j in newest] == [j.job_id for j in every[-20:]]
    with engine.connect() as conn:
        for statement, parameters in ran:
            plan = [r[3] for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters)]
            whole = [p for p in plan if p.startswith("SCAN job") and "USING" not in p]  # not through an index
            assert not whole, "; ".join(plan)
            assert any("ix_job_live" in p for p in plan), "; ".join(plan)
    engine.dispose()
