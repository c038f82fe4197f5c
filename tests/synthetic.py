"""Synthetic spool records for tests and benchmarks (bench/ puts tests/ on its path); deterministic for a seed.

Plausible values (kernel >= SM activity), a fifth of the jobs on pre-Hopper GPUs with figures left
unmeasured, so aggregates are exercised with NULLs too.
"""

from __future__ import annotations

import random

from slurm_gpueff.record import FRACTIONS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

USERS = tuple(f"user{i:03d}" for i in range(300))
ACCOUNTS = tuple(f"acct{i:02d}" for i in range(40))
VERDICTS = ("never_used", "starved", "busy_not_working", "tensor_idle", "memory_bound", "oversized", "healthy")


def record(job_id: int, *, rng: random.Random | None = None, cluster: str = "synth", node: str | None = None,
           gpus: int | None = None, timeline_points: int = 10, end: float | None = None) -> dict[str, Any]:
    """One valid spool record (record.py schema) of a finished job."""
    rng = rng or random.Random(job_id)
    n = gpus if gpus is not None else rng.choice((1, 1, 2, 4, 8))
    end = end if end is not None else 1.70e9 + job_id * 7.0
    dur = rng.uniform(300, 12 * 3600)
    pre_hopper = rng.random() < 0.2
    out = []
    for i in range(n):
        k = rng.random()
        s = None if pre_hopper else k * rng.random()
        t = None if s is None else s * rng.random()
        missing = dict.fromkeys(FRACTIONS[1:], "GPU has no GPM metrics (pre-Hopper)") if pre_hopper else {}
        out.append({
            "index": i, "minor": i, "uuid": f"GPU-{job_id:08d}-{i}", "pci_bus_id": f"00000000:{i:02X}:00.0",
            "model": "Synthetic H100", "memory_total_bytes": 80 * 2**30,
            "kernel_active": k, "sm_active": s, "sm_occupancy": None if s is None else s * 0.8,
            "tensor_active": t, "dram_active": None if s is None else rng.random() * 0.5,
            "fp64_active": None if s is None else 0.0, "fp32_active": None if s is None else rng.random() * 0.3,
            "fp16_active": None if s is None else rng.random() * 0.1,
            "memory_used_peak_bytes": rng.randrange(2**30, 80 * 2**30), "energy_j": dur * rng.uniform(80, 700),
            "power_mean_w": rng.uniform(80, 700), "samples": int(dur / 5), "source": "simulated",
            "missing": missing,
            # rounded as the collectors round timeline points (node.integrals.timeline_points)
            "timeline": [[60.0 * (p + 1), *(None if v is None else round(v, 4) for v in (k, s, t))]
                         for p in range(timeline_points)],
        })
    return {"schema": 1, "cluster": cluster, "node": node or f"gpu{job_id % 64:03d}", "job_id": job_id,
            "array_job_id": None, "array_task_id": None, "het_job_id": None, "het_job_offset": None,
            "user": rng.choice(USERS), "uid": 10000 + job_id % 300, "account": rng.choice(ACCOUNTS),
            "partition": "gpu", "start_time": end - dur, "end_time": end, "exit_code": rng.choice((0, 0, 0, 1)),
            "signal": 0, "backend": "simulated", "reason": None, "gpus": out, "written_at": end,
            "writer": "synthetic"}
