"""A scheduled task for the scheduling tests, run in-process (``build_scheduler``) or beside the built-in tasks
of a real service: ``python tests/taskprobe.py CONFIG`` is ``gpueff --config CONFIG serve`` with the probe
every ``$GPUEFF_PROBE_INTERVAL_S`` seconds (default 1), through ``serve``'s ``extra_tasks``.

Each run appends a JSON line to ``$GPUEFF_PROBE_DIR/runs``: its start by the wall clock and by the monotonic
clock (system-wide on Linux, so the test process compares them with its own), and how many runs of it were
going on at once, itself included. A run takes ``$GPUEFF_PROBE_HOLD_S`` seconds, and longer while the file
``$GPUEFF_PROBE_DIR/block`` exists (a task that hangs).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

from slurm_gpueff.service.tasks import Context, Task

_lock = threading.Lock()
_going = 0


def probe(_ctx: Context, folder: str | None = None, hold_s: float | None = None) -> str:
    global _going  # noqa: PLW0603 - the count of runs going on in this process
    folder = folder or os.environ["GPUEFF_PROBE_DIR"]
    hold_s = float(os.environ.get("GPUEFF_PROBE_HOLD_S", "0")) if hold_s is None else hold_s
    with _lock:
        _going += 1
        concurrent = _going
    try:
        with open(os.path.join(folder, "runs"), "a") as fh:
            fh.write(json.dumps({"wall": time.time(), "mono": time.monotonic(), "concurrent": concurrent}) + "\n")
        if hold_s > 0:  # (libfaketime's sleep refuses 0 s)
            time.sleep(hold_s)
        while os.path.exists(os.path.join(folder, "block")):
            time.sleep(0.05)
    finally:
        with _lock:
            _going -= 1
    return f"probe run ({concurrent} at once)"


def runs(folder: str) -> list[dict[str, float]]:
    try:
        with open(os.path.join(folder, "runs")) as fh:
            return [json.loads(line) for line in fh if line.endswith("\n")]
    except FileNotFoundError:
        return []


def main(config_path: str) -> int:
    """The service as ``gpueff serve`` runs it (its logging, its scheduler, its API), with the probe."""
    from slurm_gpueff.cli.common import log_to_stderr
    from slurm_gpueff.config import load
    from slurm_gpueff.service.scheduler import serve

    log_to_stderr(False, "serve")
    every = float(os.environ.get("GPUEFF_PROBE_INTERVAL_S", "1"))
    return serve(load(config_path), extra_tasks=[Task("probe", probe, every)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
