"""``gpueff db copy --from SRC``: a SQLite history into the configured database (a real PostgreSQL on
127.0.0.1:5432, a fresh database per test), through the real command: every table row for row, ids included,
the id sequences past the copied ids, the row counts compared; a destination that holds rows refused without
--force, a failed copy leaving the destination as it was, no password shown."""

from __future__ import annotations

import os
import pty
import random
import sqlite3
import subprocess
import sys
from datetime import date, datetime
from pathlib import Path

import pytest
import synthetic
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlalchemy import Text, cast, select
from sqlalchemy import types as sqltypes
from sqlmodel import Session, SQLModel

from slurm_gpueff import spool
from slurm_gpueff.config import Config
from slurm_gpueff.models import AlertLog, LiveSample, ReportLog, ReportOptOut, RollupPending
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.storage import migrate, rollups
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool

pytestmark = pytest.mark.process
WHEN = datetime(2026, 3, 4, 5, 6, 7, 890123)


def history(tmp_path: Path, jobs: int = 60, nul: bool = False) -> Path:
    """A SQLite history with rows in every table: jobs of one and two nodes through the real spool and ingest
    (timelines, JSON columns, SQL NULLs), their rollups, and a row of each of the other tables."""
    db = tmp_path / "history.db"
    engine = make_engine(str(db))
    rng = random.Random(5)
    spool_dir = str(tmp_path / "spool")
    for i in range(jobs + jobs // 3):
        spool.write_record(spool_dir, synthetic.record(100 + i % jobs, rng=rng, node=f"n{i // jobs}",
                                                       timeline_points=4))
    res = ingest_spool(engine, spool_dir)
    assert (res.ingested, res.failed) == (jobs + jobs // 3, 0), res.errors
    assert summarize_pending(engine, Config().analysis) == jobs  # the job summaries the rollups sum
    rollups.refresh(engine, full=True)
    with Session(engine) as s:
        s.add(ReportLog(kind="card", subject="synth:100", user="alice", status="sent", created_at=WHEN,
                        sent_at=WHEN, job_pk=1, recipients="alice@example.org"))
        s.add(ReportOptOut(user="bob", created_at=WHEN, note="asked"))
        s.add(RollupPending(month=date(2026, 2, 1), noted_at=WHEN))
        s.add(LiveSample(job_pk=2, node="n0", gpu_index=0, as_of=WHEN, covered_s=60.0, kernel_s=30.5, sm_s=None))
        s.add(AlertLog(at=WHEN, cluster="synth", job_id=101, user="carol", action="warn", detail="idle 60 min"))
        s.commit()
    engine.dispose()
    if nul:  # text PostgreSQL cannot store (SQLite can): the copy fails midway
        with sqlite3.connect(db) as con:
            con.execute("UPDATE job SET job_name = 'a' || char(0) || 'b' WHERE id = (SELECT MAX(id) FROM job)")
    return db


def table_rows(engine) -> dict[str, list[dict]]:  # noqa: ANN001
    """Every table's rows in key order, JSON columns as parsed values (so that text spacing does not count)."""
    import json

    out = {}
    with engine.connect() as conn:
        for t in SQLModel.metadata.sorted_tables:
            cols = [cast(c, Text).label(c.name) if isinstance(c.type, sqltypes.JSON) else c for c in t.columns]
            json_cols = {c.name for c in t.columns if isinstance(c.type, sqltypes.JSON)}
            out[t.name] = [{k: (json.loads(v) if k in json_cols and v is not None else ("SQL NULL" if v is None
                                else v)) for k, v in r._mapping.items()}
                           for r in conn.execute(select(*cols).order_by(*t.primary_key.columns))]
    return out


def config(tmp_path: Path, url: str, extra: str = "") -> Path:
    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[paths]\ndatabase = "{url}"\nstate_dir = "{tmp_path}/run"\nspool_dir = "{tmp_path}/spool2"\n'
                   + extra)
    return cfg


def gpueff(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "GPUEFF_CONFIG"}
    return subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.postgres
def test_copy_a_sqlite_history_into_postgresql(pg_url, tmp_path):  # noqa: F811
    src = history(tmp_path)
    cfg = config(tmp_path, pg_url)
    p = gpueff(cfg, "db", "copy", "--from", str(src))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "had no schema: made new" in p.stdout and "row counts equal in every table" in p.stdout, p.stdout
    lite, pg = make_engine(str(src), create=False), make_engine(pg_url, create=False)
    before, after = table_rows(lite), table_rows(pg)
    assert all(before[t] for t in before), {t: len(r) for t, r in before.items()}  # every table has rows
    for t in before:
        assert after[t] == before[t], t
    for t in before:  # the output's table: each table's count on both sides
        n = f"{len(before[t]):,}"
        assert any(line.split() == [t, n, n] for line in p.stdout.splitlines()), (t, p.stdout)
    # the id sequences continue after the copied ids: new records ingest into the copy
    spool.write_record(str(tmp_path / "more"), synthetic.record(9999, rng=random.Random(1), node="n9"))
    res = ingest_spool(pg, str(tmp_path / "more"))
    assert (res.ingested, res.failed) == (1, 0), res.errors
    with pg.connect() as conn:
        ids = [r.id for r in conn.execute(select(SQLModel.metadata.tables["job"].c.id))]
    assert len(ids) == len(before["job"]) + 1 and max(ids) == len(before["job"]) + 1
    with Session(pg) as s:  # and a table written row by row
        s.add(AlertLog(at=WHEN, cluster="synth", job_id=5, action="warn"))
        s.commit()


@pytest.mark.postgres
def test_a_destination_with_rows_is_refused_unless_force(pg_url, tmp_path):  # noqa: F811
    src = history(tmp_path, jobs=20)
    cfg = config(tmp_path, pg_url)
    assert gpueff(cfg, "db", "copy", "--from", str(src)).returncode == 0
    pg = make_engine(pg_url, create=False)
    with Session(pg) as s:
        s.add(ReportOptOut(user="zed", created_at=WHEN))
        s.commit()
    held = table_rows(pg)
    again = gpueff(cfg, "db", "copy", "--from", str(src))
    assert again.returncode == 1, again.stdout + again.stderr
    assert again.stdout == "" and len(again.stderr.splitlines()) == 1, again.stderr
    assert "the destination is not empty (alert_log 1, job 20," in again.stderr, again.stderr
    assert "--force" in again.stderr and "nothing was written" in again.stderr, again.stderr
    assert table_rows(pg) == held
    forced = gpueff(cfg, "db", "copy", "--from", str(src), "--force")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "row counts equal in every table" in forced.stdout
    assert table_rows(pg) == table_rows(make_engine(str(src), create=False))  # zed's opt-out is gone


@pytest.mark.postgres
def test_a_copy_that_fails_midway_leaves_the_destination_empty(pg_url, tmp_path):  # noqa: F811
    src = history(tmp_path, jobs=30, nul=True)
    cfg = config(tmp_path, pg_url)
    p = gpueff(cfg, "db", "copy", "--from", str(src))
    assert p.returncode == 1, p.stdout + p.stderr
    assert len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "failed at table job, nothing was written" in p.stderr and "0x00" in p.stderr, p.stderr
    pg = make_engine(pg_url, create=False)
    assert not any(table_rows(pg).values())  # the schema was made, no row stayed
    with sqlite3.connect(src) as con:  # the source is as it was
        con.execute("UPDATE job SET job_name = 'ab' WHERE job_name = 'a' || char(0) || 'b'")
    fixed = gpueff(cfg, "db", "copy", "--from", str(src))
    assert fixed.returncode == 0 and "row counts equal in every table" in fixed.stdout, fixed.stdout + fixed.stderr


@pytest.mark.postgres
def test_no_password_is_shown(pg_url, tmp_path):  # noqa: F811
    """The destination's password comes from paths.database_password_file and is never printed; a --from URL
    that holds one is refused (the command line is everyone's to read) without echoing it."""
    src = history(tmp_path, jobs=5)
    secret = tmp_path / "pw"
    secret.write_text("Sup3r-s3cret-pw\n")
    secret.chmod(0o600)
    cfg = config(tmp_path, pg_url, f'database_password_file = "{secret}"\n')
    ok = gpueff(cfg, "db", "copy", "--from", str(src))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    refused = gpueff(cfg, "db", "copy", "--from", "postgresql+psycopg://u:Sup3r-s3cret-pw@127.0.0.1/x")
    assert refused.returncode == 2 and "must not hold a password" in refused.stderr, refused.stderr
    down = config(tmp_path, "postgresql+psycopg://postgres@127.0.0.1:1/nowhere",
                  f'database_password_file = "{secret}"\n')
    failed = gpueff(down, "db", "copy", "--from", str(src))
    assert failed.returncode == 1 and len(failed.stderr.splitlines()) == 1, failed.stderr
    for p in (ok, refused, failed):
        assert "Sup3r-s3cret-pw" not in p.stdout + p.stderr


def test_copy_into_sqlite_and_what_is_refused(tmp_path):
    """The same copy into a SQLite file (made 0600); a source at an older schema, a missing source, the
    destination itself as the source, and the flags of other actions are refused, each in one line."""
    src = history(tmp_path, jobs=10)
    dst = tmp_path / "new" / "copy.db"
    cfg = config(tmp_path, f"sqlite:///{dst}")
    p = gpueff(cfg, "db", "copy", "--from", f"sqlite:///{src}")
    assert p.returncode == 0 and "row counts equal in every table" in p.stdout, p.stdout + p.stderr
    assert (dst.stat().st_mode & 0o777, dst.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert table_rows(make_engine(str(dst), create=False)) == table_rows(make_engine(str(src), create=False))
    same = gpueff(config(tmp_path, str(src)), "db", "copy", "--from", str(src))
    assert same.returncode == 1 and "the source and the destination are the same database" in same.stderr
    old = tmp_path / "old.db"
    engine = make_engine(str(old), create=False)
    migrate.upgrade(engine, "0013")
    engine.dispose()
    stale = gpueff(config(tmp_path, str(tmp_path / "other.db")), "db", "copy", "--from", str(old))
    assert stale.returncode == 1 and "the source is at schema revision 0013" in stale.stderr, stale.stderr
    missing = gpueff(cfg, "db", "copy", "--from", str(tmp_path / "nope.db"))
    assert missing.returncode == 1 and "does not exist" in missing.stderr, missing.stderr
    for argv in (("db", "copy"), ("db", "current", "--from", str(src)), ("db", "upgrade", "--force")):
        bad = gpueff(cfg, *argv)
        assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1, (argv, bad.stderr)
    for p in (same, stale, missing):
        assert len(p.stderr.splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr


def test_a_progress_bar_on_a_terminal(tmp_path):
    """On a terminal the copy shows a progress bar on stderr (as ingest does); never in a pipe or a log."""
    src = history(tmp_path, jobs=10)
    cfg = config(tmp_path, str(tmp_path / "copy.db"))
    leader, follower = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "GPUEFF_CONFIG"}
    p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg), "db", "copy",
                        "--from", str(src)], stdout=subprocess.PIPE, stderr=follower, env=env, timeout=120)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert p.returncode == 0, shown
    total = sum(len(r) for r in table_rows(make_engine(str(src), create=False)).values())
    assert f"copy [{'#' * 30}] {total}/{total}".encode() in shown, shown
