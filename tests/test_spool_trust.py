"""The spool takes only what the nodes wrote: real files of every kind in a real spool, real ``gpueff ingest``
processes, real SQLite (``gpueff forward`` applies the same trust on a node: tests/test_push.py). A symbolic
link, a FIFO, a socket, a directory, a group- or world-writable file, a file of another owner, an oversized
file and a badly named file go to ``quarantine/`` with the reason; the real records beside them are
ingested exactly once.
"""

from __future__ import annotations

import json
import os
import pwd
import socket
import sqlite3
import subprocess
import sys

import pytest
from hooksite import make_record
from pgutil import pg_url  # noqa: F401  (fixture)

from slurm_gpueff import spool
from slurm_gpueff.access.spool_trust import spool_trust
from slurm_gpueff.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOOD = (101, 102, 103, 104)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chowns files to another user (CI runs as root)")


def other_uid() -> int:
    for name in ("gpuser", "nobody"):
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
    return 65534


def write_config(tmp_path, database: str, *, owner: str = "", max_file_mb: float = 64.0) -> str:
    path = tmp_path / "gpueff.toml"
    path.write_text(f'[site]\ncluster = "testc"\n[paths]\nspool_dir = "{tmp_path}/spool"\n'
                    f'state_dir = "{tmp_path}/run"\ndatabase = "{database}"\n'
                    f'[spool]\nowner = "{owner}"\nmax_file_mb = {max_file_mb}\n')
    return str(path)


def gpueff(config: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", config, *args],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ, PYTHONPATH=ROOT))


def plant(spool_dir: str, tmp_path) -> dict[str, str]:
    """Real records GOOD and, beside them, one entry of every kind ingest must not take: name -> the word its
    reason must contain. Returns that map."""
    for job in GOOD:
        spool.write_record(spool_dir, make_record(job))
    inc = os.path.join(spool_dir, spool.INCOMING)
    elsewhere = str(tmp_path / "elsewhere.json")
    with open(elsewhere, "w") as fh:
        json.dump(make_record(900), fh)
    os.symlink(elsewhere, os.path.join(inc, "job-900-node01.json"))
    os.symlink("/etc/shadow", os.path.join(inc, "job-901-node01.json"))
    os.mkfifo(os.path.join(inc, "job-902-node01.json"))
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(os.path.join(inc, "job-903-node01.json"))
    srv.close()
    os.mkdir(os.path.join(inc, "job-904-node01.json"))

    def record(job: int, mode: int) -> str:
        path = os.path.join(inc, f"job-{job}-node01.json")
        with open(path, "w") as fh:
            json.dump(make_record(job), fh)
        os.chmod(path, mode)
        return path

    record(905, 0o666)
    record(906, 0o620)
    os.chown(record(907, 0o600), other_uid(), -1)
    big = record(908, 0o600)
    with open(big, "a") as fh:
        fh.write(" " * (2 * 1024 * 1024))  # valid JSON still, but over the 1 MiB of the test config
    with open(os.path.join(inc, "notes.txt"), "w") as fh:
        fh.write("x")
    return {"job-900-node01.json": "symbolic link", "job-901-node01.json": "symbolic link",
            "job-902-node01.json": "FIFO", "job-903-node01.json": "socket", "job-904-node01.json": "directory",
            "job-905-node01.json": "group- or world-writable", "job-906-node01.json": "group- or world-writable",
            "job-907-node01.json": f"owned by uid {other_uid()}", "job-908-node01.json": "over the limit",
            "notes.txt": "not named like a record"}


def check_quarantine(spool_dir: str, bad: dict[str, str]) -> None:
    q = os.path.join(spool_dir, spool.QUARANTINE)
    assert sorted(n for n in os.listdir(q) if not n.endswith(".error")) == sorted(bad)
    for name, why in bad.items():
        with open(os.path.join(q, name + ".error")) as fh:
            reason = fh.read()
        assert why in reason and len(reason.strip().splitlines()) == 1, (name, reason)
    # moved, never followed: the links are still links, the FIFO a FIFO, and nothing read /etc/shadow
    assert os.path.islink(os.path.join(q, "job-901-node01.json"))
    assert os.readlink(os.path.join(q, "job-900-node01.json")).endswith("elsewhere.json")
    assert os.listdir(os.path.join(spool_dir, spool.INCOMING)) == []


@pytest.mark.process
@needs_root
def test_ingest_quarantines_what_the_nodes_did_not_write_and_takes_the_rest_once(tmp_path):
    db = tmp_path / "db" / "gpueff.db"
    config = write_config(tmp_path, f"sqlite:///{db}", max_file_mb=1)
    spool_dir = str(tmp_path / "spool")
    bad = plant(spool_dir, tmp_path)
    p = gpueff(config, "ingest", timeout=60)  # a FIFO opened plainly would hang here
    assert p.returncode == 0, p.stderr
    assert f"ingested {len(GOOD)}, quarantined {len(bad)}, failed 0" in p.stdout, p.stdout
    check_quarantine(spool_dir, bad)
    con = sqlite3.connect(db)
    assert sorted(r[0] for r in con.execute("SELECT job_id FROM job")) == list(GOOD)
    again = gpueff(config, "ingest")
    assert again.returncode == 0 and "ingested 0, quarantined 0, failed 0" in again.stdout, again.stdout
    assert con.execute("SELECT count(*) FROM job").fetchone()[0] == len(GOOD)
    doctor = gpueff(config, "doctor", "--json")
    checks = {c["check"]: c for c in json.loads(doctor.stdout)["checks"]}
    assert checks["spool"]["status"] == "WARN" and f"{len(bad)} in quarantine" in checks["spool"]["detail"]


@pytest.mark.process
@needs_root
def test_the_configured_owner_by_name_or_uid_is_trusted_besides_root(tmp_path):
    uid = other_uid()
    name = pwd.getpwuid(uid).pw_name
    for owner in (name, str(uid)):
        base = tmp_path / owner
        base.mkdir()
        config = write_config(base, f"sqlite:///{base}/gpueff.db", owner=owner)
        os.chown(spool.write_record(str(base / "spool"), make_record(7)), uid, -1)
        spool.write_record(str(base / "spool"), make_record(8))  # root's
        p = gpueff(config, "ingest")
        assert p.returncode == 0 and "ingested 2, quarantined 0" in p.stdout, (owner, p.stdout, p.stderr)
    assert spool_trust("/nonexistent", str(uid)).owners == {0, uid}
    with pytest.raises(ConfigError, match="no such user"):
        spool_trust("/nonexistent", "no-such-user-xyz")


def test_by_default_the_owner_of_incoming_is_trusted(tmp_path):
    spool.ensure_dirs(str(tmp_path))
    assert spool_trust(str(tmp_path)).owners == {0, os.stat(tmp_path / "incoming").st_uid}
