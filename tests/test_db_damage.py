"""A damaged, foreign or non-database file stops every command with one line and exit 1; doctor FAILs it; the
first run's schema is made once however many ingests start together.

Real databases made by ``gpueff ingest``, damaged on disk; every command a real process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dbfiles import (
    ROOT,
    add_records,
    copy,
    corrupt_pages,
    foreign_database,
    gpueff,
    one_line,
    real_database,
    write_config,
)

from slurm_gpueff import spool
from slurm_gpueff.storage import migrate

pytestmark = pytest.mark.process  # gpueff commands run as processes

COMMANDS = (("ingest",), ("rollup", "--full"), ("db", "current"), ("db", "upgrade"), ("enrich",),
            ("report", "status"), ("report", "optout", "--list"))


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    return real_database(tmp_path_factory.mktemp("made"), n=300)


def damage(kind: str, made: Path, d: Path) -> Path:
    db = copy(made, d / "db")
    if kind == "corrupt pages":
        corrupt_pages(db)
    elif kind == "text":
        db.write_text("id,user\n1,alice\n")
    elif kind == "random bytes":
        db.write_bytes(os.urandom(64 * 1024))
    elif kind == "foreign":
        db.unlink()
        foreign_database(db)
    elif kind == "truncated":
        with open(db, "r+b") as fh:
            fh.truncate(db.stat().st_size // 3)
    return db


@pytest.mark.parametrize("kind", ["corrupt pages", "text", "random bytes", "foreign", "truncated"])
def test_every_database_command_fails_with_one_line_on_a_bad_file(kind, made, tmp_path):
    db = damage(kind, made, tmp_path)
    cfg = str(write_config(tmp_path, str(db)))
    add_records(tmp_path, 5000, 3)
    before = sorted(spool.pending(str(tmp_path / "spool")))
    for args in COMMANDS:
        p = gpueff("--config", cfg, *args)
        line = one_line(p)
        assert p.returncode == 1, (args, p.stderr)
        assert ("damaged or not a database" in line or "not a slurm-gpueff database" in line
                or "is damaged" in line), (args, line)
    # ingest stopped as for an unavailable database: the records wait in the spool, none quarantined
    assert sorted(spool.pending(str(tmp_path / "spool"))) == before
    assert not os.listdir(tmp_path / "spool" / spool.QUARANTINE)


@pytest.mark.parametrize("kind", ["corrupt pages", "text", "foreign"])
def test_doctor_fails_a_bad_file(kind, made, tmp_path):
    db = damage(kind, made, tmp_path)
    os.chmod(db, 0o600)
    os.chmod(db.parent, 0o700)
    p = gpueff("--config", str(write_config(tmp_path, str(db))), "doctor", "--json")
    checks = [c for c in json.loads(p.stdout)["checks"] if c["check"].startswith("database")]
    assert p.returncode == 1 and any(c["status"] == "FAIL" for c in checks if c["check"] != "database files"), checks


def test_doctor_fails_a_database_that_reads_but_cannot_be_written(made, tmp_path):
    """A header whose write version is newer than this SQLite's makes the file read-only: it reads fine
    (reachable, quick_check ok, schema at head) and every ingest fails. doctor now says so."""
    db = copy(made, tmp_path / "db")
    os.chmod(db, 0o600)
    os.chmod(db.parent, 0o700)
    with open(db, "r+b") as fh:
        fh.seek(18)  # the file format's write version
        fh.write(bytes([3]))
    p = gpueff("--config", str(write_config(tmp_path, str(db))), "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(p.stdout)["checks"]}
    assert checks["database"]["status"] == "PASS"  # it reads
    assert checks["database writable"]["status"] == "FAIL" and "readonly" in checks["database writable"]["detail"]
    assert p.returncode == 1


@pytest.mark.parametrize("first", [2, 4])
def test_ingest_on_a_corrupt_file_used_to_exit_0_with_a_sql_dump(first, made, tmp_path):
    """The issue's case: one line naming the file and the damage, exit 1, the records kept. From the third
    page on the damage is met when the schema is read; from the fifth, only when the records are merged."""
    db = copy(made, tmp_path / "db")
    corrupt_pages(db, first=first)
    add_records(tmp_path, 7000, 20)
    p = gpueff("--config", str(write_config(tmp_path, str(db))), "ingest")
    line = one_line(p)
    assert p.returncode == 1 and p.stdout == ""
    assert f"job database {db}: " in line and "the database file is damaged or not a database (database disk " \
                                                "image is malformed)" in line, line
    assert len(list(spool.pending(str(tmp_path / "spool")))) == 20


def test_db_upgrade_to_an_unknown_revision_is_a_usage_error(made, tmp_path):
    db = copy(made, tmp_path / "db")
    p = gpueff("--config", str(write_config(tmp_path, str(db))), "db", "upgrade", "--revision", "bogus")
    assert p.returncode == 2 and "unknown revision 'bogus'" in one_line(p)


def test_db_current_on_a_missing_file_does_not_create_it(tmp_path):
    db = tmp_path / "db" / "none.db"
    p = gpueff("--config", str(write_config(tmp_path, str(db))), "db", "current")
    assert p.returncode == 1 and "does not exist" in one_line(p) and not db.exists()


def test_db_current_names_a_revision_from_elsewhere(made, tmp_path):
    db = copy(made, tmp_path / "db")
    with sqlite3.connect(db) as con:
        con.execute("UPDATE alembic_version SET version_num = 'ffff9999'")
    con.close()
    cfg = str(write_config(tmp_path, str(db)))
    p = gpueff("--config", cfg, "db", "current")
    assert p.returncode == 1 and "ffff9999 (unknown to this version" in p.stdout, p.stdout + p.stderr
    p = gpueff("--config", cfg, "db", "upgrade")
    assert p.returncode == 1 and "cannot upgrade from revision ffff9999" in one_line(p)


@pytest.mark.parametrize("value", [":memory:", "file::memory:"])
def test_a_relative_path_named_like_memory_is_refused_and_not_created(value, tmp_path):
    """Found by the database fuzzer: a bare path ending in ":memory:" was taken for an in-memory database,
    so the read-only check was skipped and SQLite created the file. A relative path is now refused by the
    config itself (relative to whichever directory a command runs in), and nothing is created."""
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[paths]\ndatabase = "{value}"\nspool_dir = "{tmp_path}/s"\nstate_dir = "{tmp_path}/r"\n')
    p = gpueff("--config", str(cfg), "db", "current", cwd=str(tmp_path))
    assert p.returncode == 2 and "a relative path" in one_line(p) and sorted(os.listdir(tmp_path)) == ["g.toml"]
    absolute = tmp_path / "sub" / value
    cfg.write_text(f'[paths]\ndatabase = "{absolute}"\nspool_dir = "{tmp_path}/s"\nstate_dir = "{tmp_path}/r"\n')
    p = gpueff("--config", str(cfg), "db", "current", cwd=str(tmp_path))
    assert p.returncode == 1 and "does not exist" in one_line(p) and sorted(os.listdir(tmp_path)) == ["g.toml"]


START_TOGETHER = """
import sys, time
from slurm_gpueff.cli import gpueff
from slurm_gpueff.storage import ingest, migrate
import alembic.command, alembic.autogenerate  # noqa: F401 - loaded before the start, as the others are
migrate.head()
time.sleep(max(0.0, float(sys.argv[1]) - time.time()))
sys.exit(gpueff.main(sys.argv[2:]))
"""


@pytest.mark.parametrize("processes", [2, 4])
def test_ingests_starting_together_on_a_new_file_make_the_schema_once(processes, tmp_path):
    """Several rounds: the processes load everything, then start at the same instant on a new file (before,
    one failed with "table ... already exists"). All exit 0, the schema is at head, every record stored once."""
    import subprocess

    for rnd in range(4):
        d = tmp_path / f"r{rnd}"
        d.mkdir()
        db = d / "db" / "gpueff.db"
        cfg = str(write_config(d, str(db)))
        add_records(d, 1, 60)
        start = time.time() + 4.0
        procs = [subprocess.Popen([sys.executable, "-c", START_TOGETHER, str(start), "--config", cfg, "ingest"],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env={**os.environ, "PYTHONPATH": ROOT}) for _ in range(processes)]
        outs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0] * processes, [err for _out, err in outs]
        assert all(err == "" for _out, err in outs), outs
        with sqlite3.connect(db) as con:
            assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(migrate.head(),)]
            assert con.execute("SELECT count(*), count(DISTINCT job_id) FROM job").fetchone() == (60, 60)
            assert con.execute("SELECT count(*) FROM job_gpu").fetchone() == (120,)
        con.close()
        assert list(spool.pending(str(d / "spool"))) == []
        assert not os.listdir(d / "spool" / spool.QUARANTINE)


def leaf_page(db: Path, table: str) -> int:
    """A leaf page (1-based) of ``table`` that is not its root: damage there is met only by what reads it."""
    with sqlite3.connect(db) as con:
        pages = [p for (p,) in con.execute("SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' "
                                           "ORDER BY pageno", (table,))]
    con.close()
    return pages[len(pages) // 2]


def damage_page(db: Path, page: int) -> None:
    size = sqlite3.connect(db).execute("PRAGMA page_size").fetchone()[0]
    with open(db, "r+b") as fh:
        fh.seek((page - 1) * size)
        fh.write(bytes(range(256)) * (size // 256))


def serve_once_damaged(cfg: str, timeout: float = 60) -> str:
    """`gpueff serve` until its tasks have said they stop, then SIGTERM; its log."""
    p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", cfg, "serve"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert p.stdout is not None
    try:
        for line in p.stdout:
            lines.append(line)
            if "task report_monthly stopped" in line or time.monotonic() > deadline:
                break
    finally:
        p.send_signal(signal.SIGTERM)
        rest, _ = p.communicate(timeout=30)
    assert p.returncode == 0, "".join(lines) + rest
    return "".join(lines) + rest


def test_one_damaged_page_stops_the_service_and_every_command_until_restored(made, tmp_path):
    """One damaged b-tree page of job_gpu: commands that do not read it used to run and exit 0 on a file that
    was losing jobs. The service's integrity check (at start, then daily) finds it: every task says once
    that it stops, no traceback; a mark beside the file stops every command with one line (the reports, the
    rollups, ingest, which keeps its records, seff-gpu's card and table); doctor FAILs. A restored file runs
    again once `gpueff db check` passes."""
    db = copy(made, tmp_path / "db")
    backup = tmp_path / "backup.db"
    shutil.copy(db, backup)
    damage_page(db, leaf_page(db, "job_gpu"))
    cfg = str(write_config(tmp_path, str(db), extra=(
        f'[service]\nmetrics_port = 0\n[reports]\ndir = "{tmp_path}/reports"\nadmins = ["root@localhost"]\n')))
    log = serve_once_damaged(cfg)
    assert "Traceback" not in log, log
    damaged = [ln for ln in log.splitlines() if "is damaged" in ln and "every task stops" in ln]
    assert len(damaged) == 1 and "restored from a backup" in damaged[0], log
    for task in ("ingest", "rollups", "report_cards", "report_monthly"):
        stopped = f"task {task} stopped: the job database is damaged"
        assert sum(stopped in ln for ln in log.splitlines()) == 1, (task, log)
    assert "rollups refreshed" not in log and "task ingest: ingested" not in log
    mark = Path(str(db) + "-damaged")
    assert mark.exists() and mark.stat().st_mode & 0o777 == db.stat().st_mode & 0o644

    add_records(tmp_path, 9000, 4)
    before = sorted(spool.pending(str(tmp_path / "spool")))
    for args in (("rollup",), ("rollup", "--full"), ("report", "status"), ("report", "monthly", "--month", "2023-11",
                 "--dry-run"), ("report", "cards", "--dry-run"), ("ingest",), ("enrich",)):
        p = gpueff("--config", cfg, *args)
        line = one_line(p)
        assert p.returncode == 1 and "damaged" in line and "found by the integrity check at" in line, (args, line)
    assert sorted(spool.pending(str(tmp_path / "spool"))) == before  # kept for after the restore
    for args in (("-u", "alice", "-S", "2023-01-01"), ("5",), ("5", "--json")):
        p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", cfg, *args],
                           capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=60)
        line = one_line(p, "seff-gpu")
        assert p.returncode == 1 and "damaged" in line and "integrity check" in line, (args, line)
    p = gpueff("--config", cfg, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(p.stdout)["checks"]}
    assert p.returncode == 1 and checks["database damage mark"]["status"] == "FAIL"

    p = gpueff("--config", cfg, "db", "check")  # checked again by hand: still damaged, the mark stays
    assert p.returncode == 1 and "DAMAGED" in p.stdout and mark.exists()
    tmp = tmp_path / "db" / "restoring"
    shutil.copy(backup, tmp)
    os.replace(tmp, db)  # restored from the backup
    p = gpueff("--config", cfg, "db", "check")
    assert p.returncode == 0 and "sound" in p.stdout and "damage mark is removed" in p.stdout and not mark.exists(), \
        p.stdout + p.stderr
    p = gpueff("--config", cfg, "ingest")
    assert p.returncode == 0 and not list(spool.pending(str(tmp_path / "spool"))), p.stderr
    assert gpueff("--config", cfg, "rollup").returncode == 0


def test_the_service_checks_a_sound_database_at_start_and_runs(made, tmp_path):
    db = copy(made, tmp_path / "db")
    cfg = str(write_config(tmp_path, str(db), extra="[service]\nmetrics_port = 0\n"))
    p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", cfg, "serve"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**os.environ, "PYTHONPATH": ROOT})
    assert p.stdout is not None
    lines = []
    for line in p.stdout:
        lines.append(line)
        if "task ingest:" in line:
            break
    p.send_signal(signal.SIGTERM)
    rest, _ = p.communicate(timeout=30)
    log = "".join(lines) + rest
    assert "task database_check: quick_check ok" in log and log.index("database_check") < log.index("task ingest")
    assert not Path(str(db) + "-damaged").exists() and "stopped:" not in log
