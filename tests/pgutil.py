"""PostgreSQL for tests: a fresh database per test on the shared server, or a private cluster to stop.

The shared server (127.0.0.1:5432, trust auth; ``.ci/run`` starts it) is never stopped by a test; tests
that take the database down get their own ``initdb`` cluster on a private port (:class:`PrivateCluster`).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid

import pytest

SERVER = os.environ.get("GPUEFF_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432")


def _admin(sql: str, base: str = SERVER) -> None:
    import psycopg

    with psycopg.connect(base.replace("postgresql+psycopg", "postgresql") + "/postgres", autocommit=True) as c:
        c.execute(sql)


@pytest.fixture
def pg_url():
    """URL of a new, empty database on the shared server; dropped afterwards."""
    name = f"gpueff_t_{uuid.uuid4().hex[:12]}"
    _admin(f'CREATE DATABASE "{name}"')
    try:
        yield f"{SERVER}/{name}"
    finally:
        _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrivateCluster:
    """A throw-away PostgreSQL cluster (initdb) on a private port, which a test may stop and start."""

    def __init__(self) -> None:
        bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not bins:
            raise RuntimeError("PostgreSQL server binaries not found under /usr/lib/postgresql/*/bin "
                               "(.ci/run installs the postgresql package)")
        self.bin = os.path.dirname(bins[-1])
        self.base = tempfile.mkdtemp(prefix="gpueff-pg-")
        self.data = os.path.join(self.base, "data")
        self.port = _free_port()
        self.as_root = os.geteuid() == 0
        if self.as_root:  # PostgreSQL refuses to run as root: the cluster belongs to the postgres user
            shutil.chown(self.base, "postgres", "postgres")
            os.chmod(self.base, 0o755)
        self._run("initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "--no-sync")
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, prog: str, *args: str) -> None:
        cmd = [os.path.join(self.bin, prog), *args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self, durable: bool = False) -> None:
        """Started; ``durable``: with fsync, as a site runs it (the tests' clusters go without: faster)."""
        opts = f"-p {self.port} -k {self.base} -c listen_addresses=127.0.0.1" + ("" if durable else " -c fsync=off")
        self._run("pg_ctl", "-D", self.data, "-l", os.path.join(self.base, "log"), "-o", opts, "-w", "start")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", self.data, "-m", "fast", "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop()
        shutil.rmtree(self.base, ignore_errors=True)
