"""The SQLite database is private to whoever writes it, and a server's password comes from a private file.

Real files, real SQLite (its ``-wal``/``-shm`` included), real ``gpueff`` processes; the unreadable
password file is read by a forked child that really runs as the unprivileged ``gpuser``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import stat
import sys
import tempfile

import pytest
from dbfiles import gpueff, one_line, real_database, write_config

from slurm_gpueff.errors import GpueffError
from slurm_gpueff.storage.db import make_engine, read_password


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


def test_a_new_database_its_directories_and_wal_files_are_private_whatever_the_umask(tmp_path):
    db = tmp_path / "var" / "lib" / "gpueff.db"
    with umask(0o002):
        engine = make_engine(str(db))
    try:
        assert mode(tmp_path / "var") == 0o700 and mode(tmp_path / "var" / "lib") == 0o700
        assert mode(db) == 0o600
        with engine.connect() as conn:  # a writer connected: SQLite's side files exist now
            conn.exec_driver_sql("CREATE TABLE scratch (x INTEGER)")
            conn.exec_driver_sql("INSERT INTO scratch VALUES (1)")
            conn.commit()
            for side in ("-wal", "-shm"):
                assert mode(f"{db}{side}") == 0o600, side
    finally:
        engine.dispose()


def test_gpueff_ingest_creates_a_private_database(tmp_path):
    """As the CLI runs it (umask 022): file 0600 in a directory 0700, nothing readable by others."""
    db = real_database(tmp_path, n=5)
    assert mode(db) == 0o600 and mode(db.parent) == 0o700
    assert all(mode(p) & 0o077 == 0 for p in db.parent.iterdir())


def test_an_existing_database_readable_by_others_is_left_alone_and_doctor_fails_with_the_fix(tmp_path):
    db = real_database(tmp_path, n=5)
    db.chmod(0o644)
    db.parent.chmod(0o755)
    make_engine(str(db)).dispose()  # opened for writing: not silently changed
    assert mode(db) == 0o644 and mode(db.parent) == 0o755
    cfg = str(tmp_path / "g.toml")
    p = gpueff("--config", cfg, "doctor")
    line = next(ln for ln in p.stdout.splitlines() if "database files" in ln)
    assert p.returncode == 1 and line.startswith("FAIL"), p.stdout
    assert f"chmod 600 {db}" in line and f"chmod 700 {db.parent}" in line, line
    checks = json.loads(gpueff("--config", cfg, "doctor", "--json").stdout)["checks"]
    files = next(c for c in checks if c["check"] == "database files")
    assert files["status"] == "FAIL" and f"chmod 600 {db}" in files["detail"]
    db.chmod(0o600)
    db.parent.chmod(0o700)
    checks = json.loads(gpueff("--config", cfg, "doctor", "--json").stdout)["checks"]
    mine = {c["check"]: c["status"] for c in checks if c["check"].startswith("database")}
    assert mine == {"database files": "PASS", "database": "PASS", "database integrity": "PASS",
                    "database schema": "PASS", "database writable": "PASS"}, checks


def test_the_password_is_the_first_line_of_its_file_and_set_on_the_url(tmp_path):
    pw = tmp_path / "pw"
    pw.write_bytes(b"p@ss:w/rd?#\r\nsecond line\n")
    pw.chmod(0o600)
    assert read_password(str(pw)) == "p@ss:w/rd?#"
    engine = make_engine("postgresql+psycopg://gpueff@db.example/gpueff", create=False, password_file=str(pw))
    assert engine.url.password == "p@ss:w/rd?#" and engine.url.username == "gpueff"
    assert "p@ss" not in engine.url.render_as_string(hide_password=True) and "p@ss" not in str(engine.url)
    pw.write_text("\nsecret-on-line-two\n")
    with pytest.raises(GpueffError, match="first line is empty") as exc:
        read_password(str(pw))
    assert "secret-on-line-two" not in str(exc.value)


def test_a_password_file_every_user_may_read_is_refused_with_the_fix(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("Zq9-unique-secret\n")
    pw.chmod(0o644)
    cfg = write_config(tmp_path, "postgresql+psycopg://gpueff@127.0.0.1:1/gpueff?connect_timeout=1",
                       f'database_password_file = "{pw}"\n')
    for args in (("db", "current"), ("ingest",), ("rollup",)):
        p = gpueff("--config", str(cfg), *args)
        line = one_line(p)
        assert p.returncode == 1 and f"paths.database_password_file {pw} is readable by every user" in line, line
        assert f"chmod 600 {pw}" in line and "Zq9-unique-secret" not in p.stdout + p.stderr


def test_a_password_file_the_user_cannot_read_is_one_clear_error(tmp_path):
    """As gpuser (a forked child that drops root), a root-only password file: Permission denied, no secret."""
    user = pwd.getpwnam("gpuser") if os.geteuid() == 0 else None
    if user is None:
        pytest.skip("needs root to become gpuser")
    pw = tmp_path / "pw"
    pw.write_text("Zq9-unique-secret\n")
    pw.chmod(0o600)
    tmp_path.chmod(0o755)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become gpuser, try, report
        os.close(r)
        try:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            read_password(str(pw))
            msg = "read it"
        except GpueffError as exc:
            msg = str(exc)
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            msg = f"{type(exc).__name__}: {exc}"
        os.write(w, msg.encode())
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        msg = fh.read()
    os.waitpid(pid, 0)
    assert msg == f"cannot read paths.database_password_file {pw}: Permission denied"


@pytest.mark.parametrize("action", ["current", "check"])
def test_a_database_private_to_the_service_is_permission_denied_not_missing(action):
    """As gpuser (a forked child that drops root, running gpueff's own main): `db current` and `db check` on a
    database in a 0700 folder said "does not exist (yet)"; they say permission denied, exit 1."""
    from slurm_gpueff.cli import gpueff as cli
    from slurm_gpueff.cli import service_cmds  # noqa: F401 - loaded here: the child may not read /root's files
    from slurm_gpueff.storage import integrity  # noqa: F401

    user = pwd.getpwnam("gpuser") if os.geteuid() == 0 else None
    if user is None:
        pytest.skip("needs root to become gpuser")
    base = tempfile.mkdtemp(prefix="gpueff-private-")  # pytest's tmp_path lies in a folder only root may enter
    os.chmod(base, 0o755)
    database = os.path.join(base, "db", "gpueff.db")
    make_engine(database).dispose()  # 0600 in a 0700 folder, root's
    cfg = os.path.join(base, "g.toml")
    with open(cfg, "w") as fh:
        fh.write(f'[paths]\ndatabase = "{database}"\nspool_dir = "{base}/s"\nstate_dir = "{base}/r"\n')
    os.chmod(cfg, 0o644)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: become gpuser, run the command with stderr into the pipe
        os.close(r)
        sys.stderr = os.fdopen(w, "w")  # what gpueff prints to stderr goes to the parent
        code = 99
        try:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            code = cli.main(["--config", cfg, "db", action])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 98
        finally:
            sys.stderr.flush()
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as fh:
        err = fh.read()
    _, status = os.waitpid(pid, 0)
    shutil.rmtree(base)
    assert os.waitstatus_to_exitcode(status) == 1, err
    assert err == (f"gpueff: job database {database}: permission denied (it is private to the service account; "
                   "run this as that account or root)\n"), err
