"""Real daemons for process tests: a private ``munged`` (its own key and socket) and ``gpueff serve``."""

from __future__ import annotations

import http.client
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_munged(base: str, name: str, key: str | None = None, nice: int = 0) -> tuple[subprocess.Popen, str]:
    """A munged in ``base``/``name`` with a new key, or with the key file ``key`` (another munged's: credentials
    one makes, the other decodes), at ``nice``; (the process, its socket)."""
    d = os.path.join(base, name)
    os.makedirs(d, mode=0o755)
    if key is None:
        key = os.path.join(d, "munge.key")
        subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    sock = os.path.join(d, "munge.sock")
    proc = subprocess.Popen([*(["nice", "-n", str(nice)] if nice else []), "munged", "--foreground", "--force",
                             f"--socket={sock}", f"--key-file={key}", f"--pid-file={d}/munged.pid",
                             f"--log-file={d}/munged.log", f"--seed-file={d}/seed"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        if os.path.exists(sock):
            return proc, sock
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("munged did not start")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_health(conn_factory: Callable[[], Any], proc: subprocess.Popen, log: str, tries: int = 300) -> None:
    for _ in range(tries):
        if proc.poll() is not None:
            raise RuntimeError(f"gpueff serve exited {proc.returncode}: {pathlib.Path(log).read_text()[-2000:]}")
        try:
            c = conn_factory()
            c.request("GET", "/v1/health")
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError("the API did not come up")


def gpueff(config: str, *args: str, env: dict[str, str] | None = None, log: str | None = None) -> subprocess.Popen:
    """``gpueff --config CONFIG ARGS...`` started, its output into ``log`` (appended) or a pipe."""
    out: Any = open(log, "a") if log else subprocess.PIPE  # noqa: SIM115 - the child holds it
    try:
        return subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", config, *args],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    finally:
        if log:
            out.close()


QUIET = "".join(f"{k} = 0\n" for k in ("enrich_interval_s", "rollup_interval_s", "rollup_full_interval_s",
                                       "retention_interval_s", "cards_interval_s"))


class PushSite:
    """A service host (``gpueff serve`` with its API on a loopback port, its database and spool under
    ``base``/service) and GPU-node configs beside it that point ``gpueff forward`` at it: the push tests'
    and benchmarks' site. ``service`` and ``forward`` are more ``[service]`` keys for each side (``service`` may
    go on with more sections); ``quiet``: the service's tasks other than ingest off (:data:`QUIET`)."""

    def __init__(self, base: str, database: str, munge_socket: str, *, cluster: str = "push", service: str = "",
                 forward: str = "forward_interval_s = 0.2\nforward_max_backoff_s = 1\n", quiet: bool = True):
        self.base, self.database, self.sock, self.cluster = base, database, munge_socket, cluster
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = os.path.join(base, "serve.log")
        self.forward = forward
        tasks = QUIET if quiet else ""
        self.config = self.write("service", f'database = "{database}"\n',
                                 f'api_listen = "127.0.0.1:{self.port}"\nmetrics_port = 0\n{tasks}{service}')

    def write(self, name: str, paths: str, service: str, munge_socket: str = "") -> str:
        d = os.path.join(self.base, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "gpueff.toml")
        with open(path, "w") as fh:
            fh.write(f'[site]\ncluster = "{self.cluster}"\n[paths]\nspool_dir = "{d}/spool"\nstate_dir = "{d}/run"\n'
                     f'{paths}[service]\nmunge_socket = "{munge_socket or self.sock}"\n{service}')
        return path

    def node(self, name: str, munge_socket: str = "") -> tuple[str, str]:
        """(config, spool dir) of a GPU node: the service's address, no database."""
        cfg = self.write(name, "", f'api_url = "http://127.0.0.1:{self.port}"\n{self.forward}', munge_socket)
        return cfg, os.path.join(self.base, name, "spool")

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)

    def start(self) -> int:
        self.proc = gpueff(self.config, "serve", log=self.log)
        wait_health(self.conn, self.proc, self.log, 600)
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)

    def spool(self) -> str:
        return os.path.join(self.base, "service", "spool")
