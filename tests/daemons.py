"""Real daemons for process tests: a private ``munged`` (its own key and socket) and ``gpueff serve``."""

from __future__ import annotations

import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_munged(base: str, name: str) -> tuple[subprocess.Popen, str]:
    d = os.path.join(base, name)
    os.makedirs(d, mode=0o755)
    key = os.path.join(d, "munge.key")
    subprocess.run(["mungekey", "--create", f"--keyfile={key}"], check=True, capture_output=True)
    sock = os.path.join(d, "munge.sock")
    proc = subprocess.Popen(["munged", "--foreground", "--force", f"--socket={sock}", f"--key-file={key}",
                             f"--pid-file={d}/munged.pid", f"--log-file={d}/munged.log", f"--seed-file={d}/seed"],
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
