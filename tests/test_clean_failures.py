"""Failures that end cleanly: each is one line and a documented exit status, never a traceback, and loses nothing.

Everything real: a SQLite file locked by another process, a private PostgreSQL cluster stopped, a private
munged, `gpueff serve`, `gpueff forward` and `gpueff ingest` processes, signals sent to them, a FIFO where
the spool should be.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import synthetic
from daemons import PushSite, start_munged

from slurm_gpueff import spool
from slurm_gpueff.access.client import RECORDS_PATH
from slurm_gpueff.access.sealed import seal

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.process


def gpueff_run(config: str, *args: str, timeout: float = 120, user: str | None = None,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", config, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT, user=user,
                          env={**os.environ, **(env or {})})


@pytest.fixture
def munged() -> Iterator[tuple[str, str]]:
    """(a base folder every user may enter, a private munged's socket under it)."""
    base = tempfile.mkdtemp(prefix="gpueff-clean-", dir="/tmp")
    os.chmod(base, 0o755)
    proc, sock = start_munged(base, "munge")
    try:
        yield base, sock
    finally:
        proc.kill()
        proc.wait(10)
        shutil.rmtree(base, ignore_errors=True)


class Locker:
    """Another process holding SQLite's write lock on ``db`` (``BEGIN IMMEDIATE``) until released."""

    def __init__(self, db: str):
        code = ("import sqlite3, sys\n"
                f"con = sqlite3.connect({db!r}, isolation_level=None)\n"
                "con.execute('BEGIN IMMEDIATE')\n"
                "print('locked', flush=True)\n"
                "sys.stdin.read()\n"
                "con.execute('ROLLBACK')\n")
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(30)


def rst_push(port: int, body: bytes, munge_socket: str) -> None:
    """A sealed push (for the service's account, root) sent whole, then the connection reset at once (a node
    that stopped waiting)."""
    sealed = seal(body, 0, munge_socket, 10)
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"POST {RECORDS_PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(sealed.parts)}\r\nAuthorization: "
              f"MUNGE {sealed.envelope}\r\n\r\n".encode() + sealed.parts)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def rst_mid_request_line(port: int) -> None:
    """Half a request line, then a reset: what http.server's own reading of the request meets."""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"GET /v1/hea")
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()


def test_a_locked_sqlite_answers_busy_before_the_node_stops_waiting(munged):
    """A SQLite file locked by another process: the service's push waits for it a quarter of the nodes'
    api_timeout_s (not SQLite's 30 s), so the node gets the 503 in time, keeps its records and logs no
    "timed out"; the service logs no traceback. Nodes that stop waiting (the connection reset before the
    answer, or mid-request line) are one log line each, no BrokenPipe traceback. Once the lock is gone the
    same records go in."""
    base, sock = munged
    db = os.path.join(base, "service", "db", "gpueff.db")
    os.makedirs(os.path.dirname(db))
    site = PushSite(base, db, sock, service="api_timeout_s = 4\ningest_interval_s = 0\n",
                    forward="forward_interval_s = 0.2\nforward_max_backoff_s = 1\napi_timeout_s = 4\n")
    site.start()
    node, node_spool = site.node("node01")
    for i in range(3):
        spool.write_record(node_spool, synthetic.record(8100 + i, gpus=1))
    locker = Locker(db)
    try:
        t0 = time.monotonic()
        busy = gpueff_run(node, "forward", "--once", timeout=60)
        took = time.monotonic() - t0
        assert busy.returncode == 1, busy.stderr
        assert "503" in busy.stderr and "locked" in busy.stderr and "timed out" not in busy.stderr, busy.stderr
        assert took < 4 + 3, took  # the node's own timeout is 4 s: the answer came before it
        assert len(os.listdir(os.path.join(node_spool, "incoming"))) == 3
        resets_from = len(Path(site.log).read_text())  # the lines of the two resets below, not the start's probes
        rst_push(site.port, json.dumps({"node": "n9", "records": []}).encode(), sock)
        rst_mid_request_line(site.port)
        time.sleep(2)  # the service's push waits out its busy wait, then finds its client gone
    finally:
        locker.release()
    ok = gpueff_run(node, "forward", "--once", timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert not [n for n in os.listdir(os.path.join(node_spool, "incoming")) if n.endswith(".json")]
    site.kill(signal.SIGTERM)
    log = Path(site.log).read_text()
    assert "Traceback" not in log and "BrokenPipe" not in log.replace("(BrokenPipeError)", ""), log[-4000:]
    assert "Exception occurred during processing" not in log
    gone = [ln for ln in log[resets_from:].splitlines() if "went away" in ln]
    assert 1 <= len(gone) <= 2, log[-4000:]


def test_a_task_on_a_locked_database_fails_in_one_line(tmp_path, caplog):
    """serve's ingest task while another process holds the write lock: one ERROR line (no traceback), the
    task's last run says the database was unavailable, its records stay in the spool for the next run."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.service import tasks
    from slurm_gpueff.storage.db import make_engine

    cfg = Config({"paths": {"spool_dir": str(tmp_path / "spool"), "state_dir": str(tmp_path / "state"),
                            "database": str(tmp_path / "g.db")}})
    make_engine(cfg.paths.database).dispose()
    ctx = tasks.Context(cfg, make_engine(cfg.paths.database, busy_s=0.3))
    spool.write_record(cfg.paths.spool_dir, synthetic.record(8200, gpus=1))
    locker = Locker(cfg.paths.database)
    try:
        tasks.run_task(ctx, tasks.Task("ingest", tasks.ingest, 60))
    finally:
        locker.release()
    errors = [r for r in caplog.records if r.levelname == "ERROR" and r.name == "gpueff.serve"]
    assert len(errors) == 1 and errors[0].exc_info is None and "unavailable" in errors[0].getMessage(), errors
    assert not [r for r in caplog.records if r.exc_info]
    run = ctx.runs["ingest"]
    assert run.ok is False and run.error == "the job database is unavailable: 1 record(s) wait in the spool"
    assert len(list(spool.pending(cfg.paths.spool_dir))) == 1
    caplog.clear()
    tasks.run_task(ctx, tasks.Task("ingest", tasks.ingest, 60))
    assert ctx.runs["ingest"].ok and not list(spool.pending(cfg.paths.spool_dir))


def test_sigint_mid_analysis_is_one_line_and_loses_nothing(tmp_path):
    """Ctrl-C while `gpueff ingest` analyses the jobs it stored printed SQLAlchemy's 29-line "Error closing
    cursor" traceback. A real SIGINT once the first batch of analyses is committed (read from the database by
    this process): one line, exit 130; every record is stored, and the next run analyses the rest."""
    import sqlite3

    db = tmp_path / "db" / "g.db"
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\ndatabase = "{db}"\n')
    n = 3000
    for i in range(n):
        spool.write_record(str(tmp_path / "spool"), synthetic.record(i + 1, gpus=2, timeline_points=2), durable=False)
    p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg), "ingest"], cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def analysed() -> int:
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as con:
                return int(con.execute("SELECT count(*) FROM job WHERE analyzed_at IS NOT NULL").fetchone()[0])
        except sqlite3.Error:
            return 0

    deadline = time.monotonic() + 120
    while p.poll() is None and not analysed() and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, (p.returncode, out, err)
    assert err == "gpueff: interrupted by SIGINT\n" and out == "", err
    with sqlite3.connect(str(db)) as con:
        stored, done = con.execute("SELECT count(*), count(analyzed_at) FROM job").fetchone()
    assert stored == n and 0 < done < n
    again = gpueff_run(str(cfg), "ingest")
    assert again.returncode == 0 and f"analysed {n - done}" in again.stdout, again.stdout + again.stderr
    with sqlite3.connect(str(db)) as con:
        assert con.execute("SELECT count(*), count(analyzed_at) FROM job").fetchone() == (n, n)


def test_sigterm_and_sigint_stop_seff_gpu_in_one_line(munged):
    """seff-gpu waiting for a service that does not answer (a listening socket that never replies): SIGTERM
    is one line and exit 143, SIGINT one line and 130, as the user guide's exit status table says."""
    base, sock = munged
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    cfg = Path(base) / "seff.toml"
    cfg.write_text(f'[paths]\ndatabase = "{base}/db/g.db"\nstate_dir = "{base}/state"\n[service]\n'
                   f'api_url = "http://127.0.0.1:{listener.getsockname()[1]}"\napi_timeout_s = 300\n'
                   f'munge_socket = "{sock}"\n')
    try:
        for sig, code, word in ((signal.SIGTERM, 143, "terminated by SIGTERM"),
                                (signal.SIGINT, 130, "interrupted by SIGINT")):
            p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", str(cfg), "42"], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env={**os.environ, "GPUEFF_SEFF_VIA": "service"})
            conn, _ = listener.accept()  # it asked, and waits for the answer
            p.send_signal(sig)
            out, err = p.communicate(timeout=30)
            conn.close()
            assert (p.returncode, err, out) == (code, f"seff-gpu: {word}\n", ""), (p.returncode, err)
    finally:
        listener.close()


def test_a_spool_that_is_a_fifo_is_refused_by_config_check_and_one_line_for_ingest(tmp_path):
    """``paths.spool_dir`` naming a FIFO passed `config check`; ingest then gave a NotADirectoryError
    traceback. config check refuses it (exit 2, naming the key and what is there); ingest says it in one
    line (exit 1); serve's ingest task too, in one log line."""
    fifo = tmp_path / "spool"
    os.mkfifo(fifo)
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[paths]\nspool_dir = "{fifo}"\nstate_dir = "{tmp_path}/state"\ndatabase = "{tmp_path}/g.db"\n')
    check = gpueff_run(str(cfg), "config", "check")
    assert check.returncode == 2 and check.stdout == ""
    assert check.stderr == f"gpueff: {cfg}: paths.spool_dir = '{fifo}' is a FIFO, not a folder: point it at a " \
                           "folder (or a path that does not exist yet)\n", check.stderr
    ingest = gpueff_run(str(cfg), "ingest")
    assert ingest.returncode == 1 and ingest.stderr.count("\n") == 1 and "Traceback" not in ingest.stderr
    assert ingest.stderr.startswith(f"gpueff: cannot read the spool {fifo} (") and "Not a directory" in ingest.stderr
    (tmp_path / "state").mkdir()
    state_file = tmp_path / "state-file"
    state_file.write_text("")
    cfg.write_text(cfg.read_text().replace(f'"{tmp_path}/state"', f'"{state_file}"').replace(f'"{fifo}"',
                                                                                        f'"{tmp_path}/sp"'))
    check = gpueff_run(str(cfg), "config", "check")
    assert check.returncode == 2 and "paths.state_dir" in check.stderr and "is a file" in check.stderr


SYS_PYTHON = "/usr/bin/python3"  # gpuser's interpreter (this one lives under /root, closed to other users)
SITE_PACKAGES = os.path.join(ROOT, ".venv", "lib", f"python{sys.version_info[0]}.{sys.version_info[1]}",
                             "site-packages")


def as_gpuser(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m ARGV`` as the ordinary user gpuser: Debian's python3 with this checkout and its venv's
    libraries (SQLAlchemy and psycopg, for the direct path on a database server)."""
    env = {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONPATH": f"{ROOT}:{SITE_PACKAGES}",
           "PYTHONDONTWRITEBYTECODE": "1", **(env or {})}
    cmd = ["runuser", "-u", "gpuser", "--", "env", *(f"{k}={v}" for k, v in env.items()), SYS_PYTHON, "-m", *argv]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd="/tmp")


@pytest.mark.postgres
def test_an_ordinary_user_never_sees_the_database_url(munged):
    """PostgreSQL stopped (a private cluster, pg_ctl stop): an ordinary user's seff-gpu, through the service's
    API and on the direct path, and a gpueff command they run, say in one line that the job database is
    unavailable, never its URL, host or port (its driver's words name them); root still reads where and why."""
    from pgutil import PrivateCluster

    base, sock = munged
    cluster = PrivateCluster()
    serve = None
    try:
        cluster.start()
        url = cluster.url
        password = Path(base) / "db.password"
        password.write_text("unused-with-trust-auth\n")
        password.chmod(0o600)  # root's: gpuser reads through the service
        port = socket.socket()
        port.bind(("127.0.0.1", 0))
        api_port = port.getsockname()[1]
        port.close()
        common = f'[paths]\ndatabase = "{url}"\nspool_dir = "{base}/spool"\nstate_dir = "{base}/state"\n'
        service = Path(base) / "service.toml"
        service.write_text(common + f'database_password_file = "{password}"\n[service]\nmetrics_port = 0\n'
                           f'api_listen = "127.0.0.1:{api_port}"\nmunge_socket = "{sock}"\n'
                           "ingest_interval_s = 1\nenrich_interval_s = 0\ncards_interval_s = 0\n")
        direct = Path(base) / "direct.toml"  # no password file: every user reads the database themselves
        direct.write_text(common + f'[service]\nmunge_socket = "{sock}"\n')
        for c in (service, direct):
            c.chmod(0o644)
        assert gpueff_run(str(service), "db", "upgrade").returncode == 0
        log = Path(base) / "serve.log"
        with open(log, "w") as fh:
            serve = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(service),
                                      "serve"], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        from slurm_gpueff.access.client import HEALTH_PATH, request

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if request(f"http://127.0.0.1:{api_port}", "GET", HEALTH_PATH, timeout=5).status == 200:
                    break
            except OSError:
                time.sleep(0.2)
        cluster.stop()

        secret_bits = (url, "postgres", "127.0.0.1", str(cluster.port))
        told = "the job database is unavailable right now: try again later (the administrators see why: gpueff doctor)"
        for argv, cfg, prog in ((("slurm_gpueff.cli.seff", "4242"), service, "seff-gpu"),
                                (("slurm_gpueff.cli.seff", "-u", "gpuser"), service, "seff-gpu"),
                                (("slurm_gpueff.cli.seff", "4242"), direct, "seff-gpu"),
                                (("slurm_gpueff.cli.gpueff", "rollup"), direct, "gpueff")):
            p = as_gpuser(*argv[:1], "--config", str(cfg), *argv[1:])
            assert p.returncode == 1 and p.stderr == f"{prog}: {told}\n", (argv, cfg.name, p.stderr)
            assert not [b for b in secret_bits if b in p.stdout + p.stderr], (argv, p.stderr)
        # root (an administrator) reads where and why, through the service as directly
        p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", str(service), "4242"],
                           capture_output=True, text=True, timeout=60, cwd=ROOT,
                           env={**os.environ, "GPUEFF_SEFF_VIA": "service"})
        assert p.returncode == 1 and f"cannot read the job database {url}" in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1
    finally:
        if serve is not None:
            serve.send_signal(signal.SIGTERM)
            serve.wait(60)
        cluster.destroy()
    out = (Path(base) / "serve.log").read_text()
    assert "Traceback" not in out, out[-4000:]
    assert "task ingest failed" in out  # its runs while the server is down: one line each
