"""A push site on one machine for the push benchmarks: a private ``munged``, a ``gpueff serve`` with its API
on a loopback TCP port, and node configs that point ``gpueff forward`` at it. Root and MUNGE needed."""

from __future__ import annotations

import http.client
import os
import signal
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package, and the tests' daemons and records

from daemons import free_port, start_munged, wait_health  # noqa: E402

QUIET = "".join(f"{k} = 0\n" for k in ("enrich_interval_s", "rollup_interval_s", "rollup_full_interval_s",
                                       "retention_interval_s", "cards_interval_s"))


class PushSite:
    def __init__(self, base: str, database: str, *, forward_interval_s: float, max_backoff_s: float):
        self.base, self.database = base, database
        self.munged, self.sock = start_munged(base, "munge")
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.log = os.path.join(base, "serve.log")
        self.forward = f"forward_interval_s = {forward_interval_s}\nforward_max_backoff_s = {max_backoff_s}\n"
        self.config = self.write("service", f'database = "{database}"\n',
                                 f'api_listen = "127.0.0.1:{self.port}"\nmetrics_port = 0\n{QUIET}')

    def write(self, name: str, paths: str, service: str) -> str:
        d = os.path.join(self.base, name)
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "gpueff.toml")
        with open(path, "w") as fh:
            fh.write(f'[site]\ncluster = "bench"\n[paths]\nspool_dir = "{d}/spool"\nstate_dir = "{d}/run"\n{paths}'
                     f'[service]\nmunge_socket = "{self.sock}"\n{service}')
        return path

    def node(self, name: str) -> tuple[str, str]:
        cfg = self.write(name, "", f'api_url = "http://127.0.0.1:{self.port}"\n{self.forward}')
        return cfg, os.path.join(self.base, name, "spool")

    def start(self) -> int:
        with open(self.log, "a") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", self.config,
                                          "serve"], cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT)
        wait_health(lambda: http.client.HTTPConnection("127.0.0.1", self.port, timeout=10), self.proc, self.log, 600)
        return self.proc.pid

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)

    def close(self) -> None:
        self.kill(signal.SIGTERM)
        self.munged.kill()


def pending(spool_dir: str) -> int:
    try:
        return sum(1 for n in os.listdir(os.path.join(spool_dir, "incoming")) if n.endswith(".json"))
    except FileNotFoundError:
        return 0


def fresh_pg(url: str, name: str) -> str:
    """A new empty database ``name`` on the server of ``url``; its URL."""
    from sqlalchemy import create_engine, text

    eng = create_engine(url, isolation_level="AUTOCOMMIT")
    with eng.connect() as c:
        c.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        c.execute(text(f'CREATE DATABASE "{name}"'))
    eng.dispose()
    return url.rsplit("/", 1)[0] + "/" + name


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int, key: str = "VmRSS") -> float:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")
