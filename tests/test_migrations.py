"""Alembic migrations on SQLite and a real PostgreSQL: from empty to the models' schema, nothing left over.

If this fails after a change to models.py: add a migration (``python3 -m slurm_gpueff.storage.migrate
revision "what changed"``, then review the generated file in slurm_gpueff/migrations/versions/).
"""

from __future__ import annotations

import pytest
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlmodel import SQLModel, create_engine

from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine


def _check_migrated(url: str) -> None:
    engine = make_engine(url, create=False)
    before, after = migrate.upgrade(engine)
    assert before is None and after == migrate.head()
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head()
        assert migrate.diffs(conn) == [], "models.py and the migrations differ: add a migration"
    assert migrate.upgrade(engine) == (migrate.head(), migrate.head())  # idempotent
    engine.dispose()


def test_sqlite_migrates_from_empty_to_the_models(tmp_path):
    _check_migrated(f"sqlite:///{tmp_path}/m.db")


@pytest.mark.postgres
def test_postgres_migrates_from_empty_to_the_models(pg_url):  # noqa: F811
    _check_migrated(pg_url)


@pytest.mark.postgres
def test_postgres_knows_a_job_has_a_few_gpu_rows(pg_url):  # noqa: F811
    """The planner's sampled estimate of distinct job_pk values in job_gpu falls short by tens at a site's
    size; the migration states it as a fraction of the rows, and the GPU rows of many jobs are then looked up
    by the index, not read by scanning the table. Its downgrade takes the setting back."""
    from alembic import command
    from sqlalchemy import text

    engine = make_engine(pg_url, create=False)
    migrate.upgrade(engine)

    def job_pk() -> tuple[list[str] | None, float | None]:
        with engine.connect() as conn:
            opts = conn.execute(text("SELECT attoptions FROM pg_attribute WHERE attrelid = 'job_gpu'::regclass "
                                     "AND attname = 'job_pk'")).scalar()
            est = conn.execute(text("SELECT n_distinct FROM pg_stats WHERE tablename = 'job_gpu' "
                                    "AND attname = 'job_pk'")).scalar()
            return opts, est

    with engine.begin() as conn:  # rows for ANALYZE to take the setting into the planner's statistics
        conn.execute(text("INSERT INTO job (id, cluster, job_id, run, gpu_count, backend, record_source, enriched) "
                          "SELECT i, 'c', i, 0, 2, 'none', 'hook', false FROM generate_series(1, 500) i"))
        conn.execute(text("INSERT INTO job_gpu (job_pk, node, gpu_index, source, samples) "
                          "SELECT i, 'n', g, 'none', 0 FROM generate_series(1, 500) i, generate_series(0, 1) g"))
        conn.execute(text("ANALYZE job_gpu"))
    opts, est = job_pk()
    assert "n_distinct=-0.25" in (opts or []) and est == -0.25, (opts, est)
    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), "0012")
    opts, est = job_pk()
    assert "n_distinct=-0.25" not in (opts or []) and est == -0.5, (opts, est)  # sampled again: 2 rows a job
    engine.dispose()


@pytest.mark.postgres
def test_postgres_autovacuums_the_rewritten_tables_at_one_percent_dead(pg_url):  # noqa: F811
    """Live records rewrite job, GPU and timeline rows: at the default 20 % a year's history would let
    millions of dead versions pile up; the migration sets 1 %, and its downgrade takes it back."""
    from sqlalchemy import text

    engine = make_engine(pg_url, create=False)
    migrate.upgrade(engine)

    def options() -> dict[str, list[str] | None]:
        with engine.connect() as conn:
            return dict(conn.execute(text("SELECT relname, reloptions FROM pg_class WHERE relname IN "
                                          "('job', 'job_gpu', 'job_gpu_timeline', 'live_sample', "
                                          "'rollup_pending', 'report_log', 'usage_rollup')")).all())

    got = options()
    for table in ("job", "job_gpu", "job_gpu_timeline", "live_sample", "rollup_pending", "usage_rollup"):
        fill = ["fillfactor=80"] if table == "job_gpu" else []  # room for its HOT updates (migration 0015)
        assert sorted(got[table] or []) == ["autovacuum_analyze_scale_factor=0.02",
                                            "autovacuum_vacuum_scale_factor=0.01", *fill], table
    assert got["report_log"] is None  # written once, never rewritten: PostgreSQL's defaults
    from alembic import command

    with engine.begin() as conn:
        command.downgrade(migrate.alembic_config(conn), "0009")
    assert all(v is None for v in options().values())
    engine.dispose()


def test_sqlite_is_upgraded_on_open(tmp_path):
    engine = make_engine(str(tmp_path / "a.db"))
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head() and migrate.diffs(conn) == []


def test_opening_says_in_one_line_what_was_migrated(tmp_path, caplog):
    """The one log line of a writer's open (what `gpueff serve` shows at start instead of Alembic's): the
    revision, and the migrations it ran, from an older database too."""
    import logging

    head = migrate.head()
    older, between = f"{int(head) - 2:04d}", f"{int(head) - 1:04d}"  # two migrations behind
    engine = make_engine(str(tmp_path / "old.db"), create=False)
    migrate.upgrade(engine, older)
    engine.dispose()
    with caplog.at_level(logging.INFO, logger="slurm_gpueff.storage.migrate"):
        make_engine(str(tmp_path / "old.db")).dispose()
        make_engine(str(tmp_path / "old.db")).dispose()
    lines = [r.getMessage() for r in caplog.records if r.name == "slurm_gpueff.storage.migrate"]
    assert lines == [f"database schema: revision {head}, migrated from {older} (2 migrations: {between}, {head})",
                     f"database schema: revision {head}, nothing to migrate"]


@pytest.mark.postgres
def test_postgres_is_never_migrated_behind_the_admins_back(pg_url):  # noqa: F811
    with pytest.raises(migrate.SchemaError, match="gpueff db upgrade"):
        make_engine(pg_url)
    migrate.upgrade(make_engine(pg_url, create=False))
    make_engine(pg_url).dispose()  # now it opens


def test_a_create_all_database_from_before_migrations_is_adopted(tmp_path):
    url = f"sqlite:///{tmp_path}/old.db"
    old = create_engine(url)
    SQLModel.metadata.create_all(old)
    old.dispose()
    engine = make_engine(url)
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head()


def test_a_foreign_schema_is_refused_with_the_differences(tmp_path):
    import sqlite3

    path = tmp_path / "odd.db"
    with sqlite3.connect(path) as con:
        con.execute("CREATE TABLE job (id INTEGER PRIMARY KEY, something TEXT)")
    with pytest.raises(migrate.SchemaError, match="created without migrations"):
        make_engine(str(path))


def test_a_database_at_the_first_revision_upgrades_keeping_its_rows(tmp_path):
    """An installed 0001 database with data goes to head (rollup_pending added, the redundant job_gpu index
    dropped), rows intact; the schema then equals the models."""
    import sqlite3

    url = f"sqlite:///{tmp_path}/v1.db"
    engine = make_engine(url, create=False)
    assert migrate.upgrade(engine, "0001") == (None, "0001")
    con = sqlite3.connect(tmp_path / "v1.db")
    con.execute("INSERT INTO job (id, cluster, job_id, gpu_count, backend, record_source, enriched) "
                "VALUES (1, 'c', 42, 1, 'nvml', 'hook', 0)")
    con.execute("INSERT INTO job_gpu (id, job_pk, node, gpu_index, source, samples) VALUES (7, 1, 'n1', 0, 'nvml', 3)")
    con.commit()
    assert "ix_job_gpu_job_pk" in {r[1] for r in con.execute("PRAGMA index_list(job_gpu)")}
    con.close()
    assert migrate.upgrade(engine) == ("0001", migrate.head())
    con = sqlite3.connect(tmp_path / "v1.db")
    assert con.execute("SELECT j.job_id, g.id, g.samples FROM job j JOIN job_gpu g ON g.job_pk = j.id").fetchall() \
        == [(42, 7, 3)]
    assert "ix_job_gpu_job_pk" not in {r[1] for r in con.execute("PRAGMA index_list(job_gpu)")}
    con.close()
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head() and migrate.diffs(conn) == []
    engine.dispose()


def test_upgrading_to_per_gpu_verdicts_analyses_again_the_jobs_whose_gpus_may_differ(tmp_path):
    """Migration 0014 adds job.gpu_verdicts; a database from before holds no split of a job whose GPUs
    differ, so the jobs that may have one (more than one GPU, a verdict other than healthy) are marked for
    analysis, which writes it. One-GPU and healthy jobs keep their summary as it is."""
    from alembic import command
    from reports_data import make_db
    from sqlalchemy import text

    from slurm_gpueff.service.summarize import summarize_pending

    engine = make_db(tmp_path, [dict(job_id=1, profile="one-of-n-gpus", user="u", account="a", gpus=4),
                                dict(job_id=2, profile="idle", user="u", account="a", gpus=1),
                                dict(job_id=3, profile="bf16-healthy", user="u", account="a", gpus=2)])
    with engine.connect() as conn:  # as migrate.upgrade: SQLite's table copy must not cascade into job_gpu
        conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
        conn.commit()
        with conn.begin():
            command.downgrade(migrate.alembic_config(conn), "0013")
        assert "gpu_verdicts" not in {c["name"] for c in migrate.inspect(conn).get_columns("job")}
        conn.exec_driver_sql("PRAGMA foreign_keys=ON")
        conn.commit()
    assert migrate.upgrade(engine) == ("0013", migrate.head())
    with engine.connect() as conn:
        pending = conn.execute(text("SELECT job_id FROM job WHERE analyzed_at IS NULL")).scalars().all()
    assert pending == [1]
    assert summarize_pending(engine) == 1
    with engine.connect() as conn:
        rows = dict(conn.execute(text("SELECT job_id, gpu_verdicts FROM job ORDER BY job_id")).all())
    assert rows[2] is None and rows[3] is None and '"never_used":[3,' in rows[1].replace(" ", ""), rows
    engine.dispose()


def test_another_programs_database_is_refused_not_filled_with_ours(tmp_path):
    """A SQLite file with other tables and no revision: opening it for writing creates nothing in it."""
    import sqlite3

    db = tmp_path / "other.db"
    with sqlite3.connect(db) as con:
        con.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    con.close()
    with pytest.raises(migrate.SchemaError, match=r"not a slurm-gpueff database: it holds other tables \(invoices\)"):
        make_engine(str(db))
    with sqlite3.connect(db) as con:
        assert [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["invoices"]
    con.close()


@pytest.mark.process
@pytest.mark.postgres
def test_postgres_upgrades_started_together_are_serialised(pg_url):  # noqa: F811
    """Several `gpueff db upgrade` processes at the same instant on an empty database (an advisory lock
    serialises them): all exit 0 and the schema is made once, at head."""
    import os
    import subprocess
    import sys
    import time

    from dbfiles import ROOT, write_config
    from test_db_damage import START_TOGETHER

    cfg_dir = __import__("pathlib").Path(__import__("tempfile").mkdtemp())
    cfg = str(write_config(cfg_dir, pg_url))
    start = time.time() + 4.0
    procs = [subprocess.Popen([sys.executable, "-c", START_TOGETHER, str(start), "--config", cfg, "db", "upgrade"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": ROOT}) for _ in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, outs
    assert sum("-> " in out for out, _err in outs) == 1 and sum("already at" in out for out, _ in outs) == 3, outs
    engine = make_engine(pg_url, create=False)
    with engine.connect() as conn:
        assert migrate.current(conn) == migrate.head() and migrate.diffs(conn) == []
    engine.dispose()


@pytest.mark.postgres
def test_postgres_sessions_run_without_jit_keeping_the_urls_options(pg_url):  # noqa: F811
    """JIT compiled the large aggregates (a year of an account, a month's rollup) for longer than it saved:
    the product's sessions turn it off, and options a site gives in the URL still apply."""
    from sqlalchemy import text

    for url, work_mem in ((pg_url, None), (pg_url + "?options=-c%20work_mem%3D7MB", "7MB")):
        engine = make_engine(url, create=False)
        with engine.connect() as conn:
            assert conn.execute(text("SHOW jit")).scalar() == "off"
            if work_mem:
                assert conn.execute(text("SHOW work_mem")).scalar() == work_mem
        engine.dispose()
