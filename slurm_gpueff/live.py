"""Running jobs' live records: each job's figures so far, spooled like a finished job's record.

A job runs on this node while its Prolog state (``<state_dir>/jobs/<id>.json``) exists: the Prolog writes
it, the Epilog removes it once the final record is spooled. For each such job, :func:`publish` asks the
collector the Prolog used for the figures so far (``Collector.peek``: the nvml agent's counters up to its
last reading, never disturbing the job's measurement) and writes a record marked ``live`` as
``job-<id>-r<run>~live-<node>.json``, which each new snapshot replaces. Ingest keeps one live row per job
and lets the final record replace it (storage/merge.py); a live record that comes after the final one
changes nothing. The node agent calls :func:`publish` every ``agent.live_interval_s`` right after a
reading; ``gpueff live`` runs one pass (for the simulated backend, tests and timers).

Like the hooks, this never raises for one job's sake: a job whose state cannot be read is logged and
skipped, and the next pass tries again.
"""

from __future__ import annotations

import time

from . import jobstate, spool
from . import record as recmod
from .collectors.base import JobContext, Measurement, NoneCollector
from .collectors.choice import named_collector
from .hook import build_record
from .slurm import hookenv

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from .config import Config


def live_record(cfg: Config, saved: dict[str, Any], now: float) -> dict[str, Any] | None:
    """The job's live record from its Prolog state, or None for a state without the job's environment."""
    env = saved.get("env")
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return None
    job = hookenv.parse(env)
    if job.job_id is None:
        return None
    start = saved.get("start_time")
    gpus = job.gpu_indexes or jobstate.saved_gpus(saved)
    jc = JobContext(job.job_id, job.node, job.cluster or cfg.site.cluster, gpus,
                    start_time=start if isinstance(start, int | float) else None, end_time=now, env=env)
    backend = saved.get("backend")
    backend = backend if isinstance(backend, str) else "none"
    try:
        meas = named_collector(cfg, backend).peek(jc, saved.get("start"))
    except Exception as exc:  # noqa: BLE001 - one job's figures must not stop the others'
        meas = NoneCollector(cfg, f"live figures failed: {type(exc).__name__}: {exc}").stop(jc, None)
    if not isinstance(meas, Measurement):
        meas = NoneCollector(cfg, "collector returned no measurement").stop(jc, None)
    run = saved.get("run")
    run = run if isinstance(run, int) and not isinstance(run, bool) and run >= 0 else 0
    reasons = [f"at job start: {saved['reason']}"] if isinstance(saved.get("reason"), str) else []
    rec = build_record(job, jc, meas, reasons, (run, False))
    rec.update(live=True, exit_code=None, signal=None)
    return rec


def publish(cfg: Config, *, now: float | None = None, log: Callable[[str], None] | None = None) -> list[str]:
    """Write a live record for every job running on this node; the paths written."""
    t = time.time() if now is None else now
    out = []
    for path in jobstate.running(cfg.paths.state_dir):
        saved, problem = jobstate.load(path)
        if saved is None:
            if log:
                log(f"{path}: {problem}; no live record")
            continue
        try:
            rec = live_record(cfg, saved, t)
            if rec is None:
                continue
            recmod.validate(rec)
            out.append(spool.write_record(cfg.paths.spool_dir, rec, durable=False))  # the next one replaces it
        except Exception as exc:  # noqa: BLE001 - log, skip this job, go on
            if log:
                log(f"{path}: no live record: {type(exc).__name__}: {exc}")
    return out
