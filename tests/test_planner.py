"""storage/planner.py: what PostgreSQL's planner is told about job_gpu.job_pk comes from the site's own rows
(job rows over GPU rows), set by the service's daily retention task. Real PostgreSQL, migrated to the head."""

from __future__ import annotations

import logging
import uuid

import pytest
from pgutil import SERVER, _admin, pg_url  # noqa: F401  (fixture)
from sqlalchemy import text
from sqlalchemy.engine import Engine

from slurm_gpueff.config import Config
from slurm_gpueff.service import tasks
from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.planner import job_gpu_distinct


def _migrated(url: str) -> Engine:
    engine = make_engine(url, create=False)
    migrate.upgrade(engine)
    return engine


def _add_jobs(engine: Engine, first: int, jobs: int, gpus: int) -> None:
    """``jobs`` jobs (ids from ``first``) of ``gpus`` GPU rows each."""
    ids = "generate_series(CAST(:a AS integer), CAST(:b AS integer)) i"
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO job (id, cluster, job_id, run, gpu_count, backend, record_source, enriched) "
                          f"SELECT i, 'c', i, 0, CAST(:g AS integer), 'none', 'hook', false FROM {ids}"),
                     {"a": first, "b": first + jobs - 1, "g": gpus})
        conn.execute(text("INSERT INTO job_gpu (job_pk, node, gpu_index, source, samples) SELECT i, 'n', g, 'none', 0 "
                          f"FROM {ids}, generate_series(0, CAST(:g AS integer) - 1) g"),
                     {"a": first, "b": first + jobs - 1, "g": gpus})


def _told(engine: Engine) -> tuple[list[str], float | None]:
    """job_pk's n_distinct as set (its option, among any others the server keeps there), and the n_distinct
    that the planner's statistics hold."""
    with engine.connect() as conn:
        options = conn.execute(text("SELECT attoptions FROM pg_attribute WHERE attrelid = 'job_gpu'::regclass "
                                    "AND attname = 'job_pk'")).scalar()
        stats = conn.execute(text("SELECT n_distinct FROM pg_stats WHERE tablename = 'job_gpu' "
                                  "AND attname = 'job_pk'")).scalar()
    return [o for o in options or [] if o.startswith("n_distinct=")], stats


@pytest.mark.postgres
@pytest.mark.parametrize("gpus, told", [(8, -0.125), (1, -1.0), (2, -0.5), (128, -1 / 64)])
def test_the_planner_is_told_the_sites_gpu_rows_a_job(pg_url, gpus, told):  # noqa: F811
    """Jobs of 8 GPUs: one job_pk in 8 rows (-0.125), where migration 0013 said 4 (-0.25); of one GPU each:
    every row its own job (-1); past 64 GPU rows a job the figure stays at -1/64. The setting is read by
    ANALYZE, run then: the planner's statistics hold it. The tables were never analysed with rows in them
    (their statistics say -1 or 0 rows): the rows are counted."""
    engine = _migrated(pg_url)
    assert _told(engine)[0] == ["n_distinct=-0.25"]
    _add_jobs(engine, 1, 8192 // gpus, gpus)
    got = job_gpu_distinct(engine)
    assert got is not None and (got.jobs, got.gpu_rows) == (8192 // gpus, 8192)
    assert (got.was, got.now, got.changed) == (-0.25, told, True), got
    assert _told(engine) == ([f"n_distinct={told:g}"], told)
    assert got.line() == f"job_gpu.job_pk n_distinct set to {told:g} (was -0.25; {8192 // gpus:,} jobs, 8,192 GPU rows)"
    again = job_gpu_distinct(engine)  # the same rows: nothing to change
    assert again is not None and (again.was, again.now, again.changed) == (told, told, False)
    assert again.line().startswith(f"job_gpu.job_pk n_distinct kept at {told:g} (")
    engine.dispose()


@pytest.mark.postgres
def test_a_setting_within_ten_percent_is_left_as_it_is(pg_url):  # noqa: F811
    """Jobs of 4 GPUs and a few of 5 (-0.2439): within 10 % of the -0.25 set, which stays (no ALTER, no
    ANALYZE); more jobs of 8 GPUs (-0.2105, 16 % off): set. Nothing set at all (RESET): set whatever it is."""
    engine = _migrated(pg_url)
    _add_jobs(engine, 1, 450, 4)
    _add_jobs(engine, 1001, 50, 5)
    got = job_gpu_distinct(engine)
    assert got is not None and (got.jobs, got.gpu_rows, got.was, got.now) == (500, 2050, -0.25, -0.25), got
    assert not got.changed and _told(engine)[0] == ["n_distinct=-0.25"]
    _add_jobs(engine, 2001, 100, 8)
    got = job_gpu_distinct(engine)
    assert got is not None and (got.was, got.now) == (-0.25, pytest.approx(-600 / 2850, rel=1e-5)), got
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE job_gpu ALTER COLUMN job_pk RESET (n_distinct)"))
    got = job_gpu_distinct(engine)
    assert got is not None and got.was is None and got.now == pytest.approx(-600 / 2850, rel=1e-5), got
    assert got.line().startswith("job_gpu.job_pk n_distinct set to -0.210526 (was none; 600 jobs, 2,850 GPU rows)")
    engine.dispose()


@pytest.mark.postgres
def test_the_rows_are_the_tables_statistics_not_a_count(pg_url):  # noqa: F811
    """Once ANALYZE (autovacuum's, at a site) has counted the rows, their figure is read from pg_class, not
    counted again each day: a site's job_gpu holds tens of millions. Autovacuum is off here so that the
    statistics stay those of the ANALYZE below."""
    engine = _migrated(pg_url)
    with engine.begin() as conn:
        conn.execute(text("ALTER TABLE job SET (autovacuum_enabled = false)"))
        conn.execute(text("ALTER TABLE job_gpu SET (autovacuum_enabled = false)"))
    _add_jobs(engine, 1, 400, 1)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE job"))
        conn.execute(text("ANALYZE job_gpu"))
    _add_jobs(engine, 1001, 100, 8)  # not in the statistics yet: 500 jobs, 1,200 GPU rows in fact
    got = job_gpu_distinct(engine)
    assert got is not None and (got.jobs, got.gpu_rows, got.now) == (400, 400, -1.0), got
    engine.dispose()


@pytest.mark.postgres
def test_no_gpu_rows_and_a_role_that_does_not_own_the_table_change_nothing(pg_url):  # noqa: F811
    """An empty database has no figure to give. A role that may read the tables but does not own job_gpu
    (only its owner may ALTER it) says so in the line, and the setting stays."""
    engine = _migrated(pg_url)
    got = job_gpu_distinct(engine)
    assert got is not None and (got.jobs, got.gpu_rows, got.was, got.now) == (0, 0, -0.25, -0.25), got
    assert got.line() == "job_gpu.job_pk n_distinct left at -0.25: no GPU rows yet (0 jobs, 0 GPU rows)"
    _add_jobs(engine, 1, 100, 8)
    role = f"gpueff_t_{uuid.uuid4().hex[:12]}"
    database = pg_url.rsplit("/", 1)[1]
    _admin(f'CREATE ROLE "{role}" LOGIN')
    reader = None
    try:
        with engine.begin() as conn:
            conn.execute(text(f'GRANT SELECT ON job, job_gpu TO "{role}"'))
        reader = make_engine(f"{SERVER.replace('postgres@', f'{role}@')}/{database}", create=False)
        got = job_gpu_distinct(reader)
        assert got is not None and (got.was, got.now, got.changed) == (-0.25, -0.25, False), got
        assert got.line() == ("job_gpu.job_pk n_distinct left at -0.25: -0.125 measured, but the service's "
                              "database role does not own job_gpu, and only its owner may set it "
                              "(100 jobs, 800 GPU rows)")
        assert _told(engine)[0] == ["n_distinct=-0.25"]
    finally:
        if reader is not None:
            reader.dispose()
        with engine.begin() as conn:  # its grants, so that the role can go
            conn.execute(text(f'DROP OWNED BY "{role}"'))
        engine.dispose()
        _admin(f'DROP ROLE "{role}"')


@pytest.mark.postgres
@pytest.mark.parametrize("days", [180.0, 0.0])
def test_the_daily_retention_task_sets_it_and_logs_it(pg_url, caplog, days):  # noqa: F811
    """The service's retention task (daily) measures it, whether timelines are deleted or kept forever, and
    its log line says what it set."""
    engine = _migrated(pg_url)
    _add_jobs(engine, 1, 500, 8)
    ctx = tasks.Context(Config({"service": {"timeline_retention_days": days}}), engine)
    with caplog.at_level(logging.INFO, logger="gpueff.serve"):
        tasks.run_task(ctx, tasks.Task("retention", tasks.retention, 86400.0))
    assert ctx.runs["retention"].ok, caplog.text
    done = "deleted 0 timeline(s)" if days else "timelines are kept forever"
    line = next(r.getMessage() for r in caplog.records if r.getMessage().startswith("task retention: "))
    assert line.startswith(f"task retention: {done}") and ("; job_gpu.job_pk n_distinct set to -0.125 "
                                                          "(was -0.25; 500 jobs, 4,000 GPU rows)") in line, line
    engine.dispose()


def test_sqlite_has_no_such_setting(tmp_path):
    """SQLite's planner has no n_distinct: nothing to do, and the retention task's line says nothing of it."""
    engine = make_engine(f"sqlite:///{tmp_path}/gpueff.db")
    assert job_gpu_distinct(engine) is None
    ctx = tasks.Context(Config(), engine)
    assert tasks.retention(ctx) == "deleted 0 timeline(s)"
    engine.dispose()


@pytest.mark.postgres
def test_a_batch_of_jobs_to_analyse_is_read_from_its_own_index(pg_url):  # noqa: F811
    """Summarizing reads the jobs waiting for their analysis, oldest first. Those are the newest jobs: here
    200,000 analysed jobs, then 20,000 pending (an outage's backlog), the table analysed (statistics) as a
    site's is. Without ix_job_pending PostgreSQL walks the primary key from the first job, filtering, and reads
    every analysed job before the first pending one (checked here by dropping the index in a transaction
    rolled back); with it, the batch is read from the pending rows alone."""
    import re

    from slurm_gpueff.service.summarize import pending_query

    engine = _migrated(pg_url)
    _add_jobs(engine, 1, 220_000, 1)
    with engine.begin() as conn:
        conn.execute(text("UPDATE job SET analyzed_at = now() WHERE id <= 200000"))
        conn.execute(text("ANALYZE job"))
    sql = str(pending_query().compile(engine, compile_kwargs={"literal_binds": True}))

    def plan(conn) -> tuple[str, int]:  # type: ignore[no-untyped-def]
        text_ = "\n".join(r[0] for r in conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")))
        return text_, sum(int(n) for n in re.findall(r"Rows Removed by Filter: (\d+)", text_))

    with engine.connect() as conn:
        got = [r.id for r in conn.execute(pending_query())]
        with_index, skipped = plan(conn)
        conn.execute(text("DROP INDEX ix_job_pending"))
        without, skipped_without = plan(conn)
        conn.rollback()  # the index is back
    assert got == list(range(200_001, 200_501)), with_index
    assert skipped == 0 and "ix_job_pending" in with_index, with_index
    assert skipped_without >= 200_000, without  # what the index saves: the analysed jobs read and dropped
