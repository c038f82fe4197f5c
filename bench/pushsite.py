"""A push site on one machine for the push benchmarks: a private ``munged``, a ``gpueff serve`` with its API
on a loopback TCP port, and node configs that point ``gpueff forward`` at it. Root and MUNGE needed."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the package, and the tests' daemons and records

from daemons import PushSite, start_munged  # noqa: E402


def start_site(base: str, database: str, *, forward_interval_s: float, max_backoff_s: float, service: str = "",
               quiet: bool = True, cluster: str = "bench") -> tuple[PushSite, subprocess.Popen]:
    """A push site with a private munged of its own; (the site, munged) - stop both when done. ``service``,
    ``quiet``: as PushSite's."""
    munged, sock = start_munged(base, "munge")
    site = PushSite(base, database, sock, cluster=cluster, service=service, quiet=quiet,
                    forward=f"forward_interval_s = {forward_interval_s}\nforward_max_backoff_s = {max_backoff_s}\n")
    return site, munged


def start_node_munged(base: str, site_munge: str) -> tuple[subprocess.Popen, str]:
    """A second munged with the site's key, at nice 19, for the simulated nodes: on a real site each node makes
    its credentials with its own munged, and the service host's munged only decodes them."""
    return start_munged(base, "node-munge", key=os.path.join(site_munge, "munge.key"), nice=19)


def answered(log: str, status: int) -> int:
    """How many requests the service's log says it answered with ``status``: each one's line, plus the counts
    of the refusals it held back (service/refusals.py: ``refused N more times ..., the last: ... -> 503``)."""
    shown = sum(1 for line in log.splitlines() if f" -> {status} " in line and " refused " not in line)
    held = sum(int(n) for n in re.findall(rf" refused (\d+) more times? in the last .* -> {status} ", log))
    return shown + held


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


def node_name(i: int) -> str:
    return f"gpu{i:05d}"


_NAMES = re.compile(rb'\{"name":"([^"]+)","record":')


def trace_pushes(base: str, first: int) -> None:
    """Each push of this process's forwarders traced into ``base``/pushes-``first``.tsv, a line a push: when it
    was sent and answered (wall clock), its status, and for each record in it how long it had waited in its
    node's spool (since its file was last written) when the push was sent: a record's lag split into its wait
    on the node and its push's time in the service. The forwarder's own push call is wrapped, unchanged."""
    from slurm_gpueff.node import push

    out = open(os.path.join(base, f"pushes-{first}.tsv"), "a", buffering=1)  # noqa: SIM115 - the process's life
    post = push.post_signed  # type: ignore[attr-defined]
    lock = threading.Lock()

    def traced(service: Any, path: str, body: bytes, **kw: Any) -> Any:
        t0 = time.time()
        spool_in = os.path.join(base, "nodes", threading.current_thread().name, "spool", "incoming")
        waits = []
        for name in _NAMES.findall(body):
            with contextlib.suppress(OSError):  # gone meanwhile: replaced by a newer snapshot
                waits.append(t0 - os.stat(os.path.join(spool_in, name.decode())).st_mtime)
        status = "-"
        try:
            reply = post(service, path, body, **kw)
            status = str(reply.status)
            return reply
        except Exception as exc:  # the forwarder's to handle; its reason kept, in one field, for the split
            status = f"- {type(exc).__name__}: {' '.join(str(exc).split())}"[:300]
            raise
        finally:
            line = f"{t0:.3f}\t{time.time():.3f}\t{status}\t{','.join(f'{w:.2f}' for w in waits)}\n"
            with lock:
                out.write(line)

    push.post_signed = traced  # type: ignore[attr-defined]


def run_nodes(first: int, count: int, base: str, service: dict[str, object], stop: Any, cluster: str,
              nice: int = 0, trace: bool = False) -> None:
    """``count`` simulated nodes' forwarders (the real loop, node/push.py) as threads of this process, each on
    its own spool under ``base``/nodes, until ``stop`` (a multiprocessing Event) is set; at ``nice`` (their
    ``munge`` commands too); ``trace``: each push traced (:func:`trace_pushes`)."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.node.push import run_forwarder

    if nice:
        os.nice(nice)
    if trace:
        trace_pushes(base, first)

    logging.basicConfig(filename=os.path.join(base, f"nodes-{first}.log"), level=logging.WARNING)
    halt = threading.Event()
    threads = []
    for i in range(first, first + count):
        d = os.path.join(base, "nodes", node_name(i))
        cfg = Config({"site": {"cluster": cluster}, "paths": {"spool_dir": f"{d}/spool", "state_dir": f"{d}/run"},
                      "service": service})
        threads.append(threading.Thread(target=run_forwarder, args=(cfg, halt), daemon=True, name=node_name(i)))
    random.shuffle(threads)
    interval = float(service["forward_interval_s"])  # type: ignore[arg-type]
    for t in threads:  # nodes boot at different times
        t.start()
        time.sleep(interval / len(threads))
    stop.wait()
    halt.set()
    for t in threads:
        t.join(60)
