"""Secrets are never printed: the database password (from ``paths.database_password_file``) and the mail
password (``mail.password_file``) appear in no output of any command that prints config or errors.

Real processes against (a) a port nothing listens on and (b) a private PostgreSQL cluster whose role needs
that password (scram-sha-256), with the right password and with a wrong one. libpq's own password file
(``PGPASSFILE``) still works when ``paths.database_password_file`` is empty.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest
from dbfiles import ROOT, gpueff
from pgutil import PrivateCluster, _free_port
from sites import sim_record, site_config, spool_records

pytestmark = [pytest.mark.postgres, pytest.mark.process]

SECRET = f"Sx{uuid.uuid4().hex}"  # unique: found in an output only if that output printed it
MAIL_SECRET = f"Mx{uuid.uuid4().hex}"

COMMANDS = (("config", "check"), ("config", "check", "--json"), ("doctor",), ("doctor", "--json"), ("ingest",),
            ("rollup",), ("db", "current"), ("db", "upgrade"), ("enrich",), ("report", "status"),
            ("forward", "--once"))


@pytest.fixture(scope="module")
def scram_cluster():
    """A private cluster: the postgres user by trust (to set it up), every other role by scram password."""
    cluster = PrivateCluster()
    with open(os.path.join(cluster.data, "pg_hba.conf"), "w") as fh:
        fh.write("local all all trust\nhost all postgres 127.0.0.1/32 trust\n"
                 "host all all 127.0.0.1/32 scram-sha-256\n")
    cluster.start()
    try:
        import psycopg

        with psycopg.connect(f"postgresql://postgres@127.0.0.1:{cluster.port}/postgres", autocommit=True) as c:
            c.execute("SET password_encryption = 'scram-sha-256'")
            c.execute(f"CREATE ROLE gpueff LOGIN PASSWORD '{SECRET}'")
            c.execute("CREATE DATABASE gpueff OWNER gpueff")
        yield cluster
    finally:
        cluster.destroy()


def site(tmp_path, url: str, password: str):
    pw = tmp_path / "db.pw"
    pw.write_text(password + "\n")
    pw.chmod(0o600)
    mail_pw = tmp_path / "mail.pw"
    mail_pw.write_text(MAIL_SECRET + "\n")
    mail_pw.chmod(0o600)
    spool_records(tmp_path / "spool", (sim_record(job_id) for job_id in (1, 2, 3)))
    return site_config(tmp_path, url, cluster=None, name="g.toml",
                       extra=f'database_password_file = "{pw}"\n\n[mail]\nhost = "127.0.0.1"\n'
                             f'username = "reports"\npassword_file = "{mail_pw}"\n')


WRITERS = {("ingest",), ("rollup",), ("db", "upgrade"), ("enrich",), ("forward", "--once")}


def run_all(cfg) -> list[subprocess.CompletedProcess[str]]:
    """Every command once. Two lanes at a time: the commands that write the database in their order, then
    ``gpueff serve`` (which ingests too); beside them the ones that only read."""
    env = {**os.environ, "PYTHONPATH": ROOT}

    def writers() -> list[subprocess.CompletedProcess[str]]:
        out = [gpueff("--config", str(cfg), *args, timeout=90) for args in COMMANDS if args in WRITERS]
        return [*out, serve(cfg, env)]

    def readers() -> list[subprocess.CompletedProcess[str]]:
        out = [gpueff("--config", str(cfg), *args, timeout=90) for args in COMMANDS if args not in WRITERS]
        for args in (("123",), ("-u", "alice"), ("123", "--json")):
            out.append(subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", str(cfg), *args],
                                      capture_output=True, text=True, timeout=90, env=env))
        return out

    with ThreadPoolExecutor(2) as pool:
        lanes = [pool.submit(writers), pool.submit(readers)]
        return [p for lane in lanes for p in lane.result()]


def serve(cfg, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``gpueff serve`` until it fails at start, or for a few seconds (then SIGTERM)."""
    p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg), "serve"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        out, err = p.communicate(timeout=8)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def assert_no_secret(results: list[subprocess.CompletedProcess[str]]) -> None:
    assert len(results) == len(COMMANDS) + 4
    for p in results:
        text = p.stdout + p.stderr
        assert SECRET not in text and MAIL_SECRET not in text, (p.args, text[-2000:])


def test_nothing_prints_the_password_when_the_server_is_unreachable(tmp_path):
    url = f"postgresql+psycopg://gpueff@127.0.0.1:{_free_port()}/gpueff?connect_timeout=1"
    results = run_all(site(tmp_path, url, SECRET))
    assert_no_secret(results)
    by_args = {tuple(p.args[5:]): p for p in results}
    assert by_args[("db", "current")].returncode == 1 and by_args[("rollup",)].returncode == 1
    assert by_args[("config", "check")].returncode == 0
    assert str(tmp_path / "db.pw") in by_args[("config", "check")].stdout  # the file is named, not read out


def test_nothing_prints_the_password_on_a_server_that_needs_it(scram_cluster, tmp_path):
    url = f"postgresql+psycopg://gpueff@127.0.0.1:{scram_cluster.port}/gpueff?connect_timeout=5"
    cfg = site(tmp_path, url, SECRET)
    up = gpueff("--config", str(cfg), "db", "upgrade")
    assert up.returncode == 0 and "-> " in up.stdout, up.stderr  # the password from the file logs in
    results = run_all(cfg)
    assert_no_secret(results)
    by_args = {tuple(p.args[5:]): p for p in results}
    for args in (("ingest",), ("rollup",), ("db", "current"), ("report", "status")):
        assert by_args[args].returncode == 0, (args, by_args[args].stderr)
    assert "ingested 3" in by_args[("ingest",)].stdout


def test_nothing_prints_a_wrong_password(scram_cluster, tmp_path):
    url = f"postgresql+psycopg://gpueff@127.0.0.1:{scram_cluster.port}/gpueff?connect_timeout=5"
    wrong = SECRET[::-1]
    results = run_all(site(tmp_path, url, wrong))
    assert_no_secret(results)
    for p in results:
        assert wrong not in p.stdout + p.stderr, p.args
    db = next(p for p in results if tuple(p.args[5:]) == ("db", "current"))
    assert db.returncode == 1 and "password authentication failed" in db.stderr, db.stderr


def test_libpq_password_file_works_when_the_key_is_empty(scram_cluster, tmp_path):
    pgpass = tmp_path / "pgpass"
    pgpass.write_text(f"127.0.0.1:{scram_cluster.port}:gpueff:gpueff:{SECRET}\n")
    pgpass.chmod(0o600)
    url = f"postgresql+psycopg://gpueff@127.0.0.1:{scram_cluster.port}/gpueff?connect_timeout=5"
    cfg = site_config(tmp_path, url, cluster=None, name="g.toml")
    p = gpueff("--config", str(cfg), "db", "current", env={"PGPASSFILE": str(pgpass)})
    assert p.returncode in (0, 1) and "password authentication failed" not in p.stderr, p.stderr
    assert "gpueff@127.0.0.1" in p.stdout and SECRET not in p.stdout + p.stderr
