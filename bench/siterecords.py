"""Spool records for the site bench shaped as the real Epilog writes them on an NVML/GPM node.

A record's shape (its keys, the GPU entry's ``window``, ``window_s``, ``measured_s``, every GPM pipe, the
``missing`` map) comes from the product itself: the real node agent (node/agent.py) is driven by the tests'
fake GPU sampler (tests/fake_gpus.py: the only stand-in, for the GPU) over a simulated job, and the real NVML
collector (collectors/nvml.py) turns its files into the GPU entries, once per GPU count at start-up. Each
bench record is then that template with its own job's ids, node, times and figures: a timeline of the
length the agent gives a job of that duration (one point a minute, neighbours merged past 100:
node/integrals.timeline_points), per-GPU figures drawn per job so that verdicts differ.

What this does not cover: the ``processes`` and ``shared`` entries of a GPU shared by several jobs (the site
bench gives every job its GPUs alone), DCGM-shaped records, and MIG slices.
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import sys
import tempfile
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [_ROOT, os.path.join(_ROOT, "tests")]

TIMELINE_STEP_S = 60.0  # [agent] timeline_interval_s, the default
MAX_POINTS = 100  # node/integrals.timeline_points' max_points


def agent_template(gpus: int = 8) -> dict[str, Any]:
    """One finished job's record on ``gpus`` Hopper GPUs, made by the real agent and NVML collector."""
    from fake_gpus import FakeClock, FakeSampler, GiB, hopper, make_config, make_dev_dir

    from slurm_gpueff import record
    from slurm_gpueff.collectors.base import JobContext
    from slurm_gpueff.collectors.nvml import NvmlCollector
    from slurm_gpueff.node.agent import Agent

    tmp = tempfile.mkdtemp(prefix="gpueff-shape-")
    uuids = [f"GPU-{i:08x}-5a5a-5a5a-5a5a-5a5a5a5a5a5a" for i in range(gpus)]
    clock = FakeClock()
    fake = FakeSampler(clock, [hopper(u, i, i) for i, u in enumerate(uuids)])
    cfg = make_config(tmp)
    agent = Agent(cfg, fake, wall_clock=clock.wall, host="template")
    agent.open()
    coll = NvmlCollector(cfg, dev_dir=make_dev_dir(tmp, list(range(gpus))), now=clock.wall)
    for _ in range(3):
        clock.advance(5.0)
        agent.tick()
    job = JobContext(1, "template", "bench", list(range(gpus)), start_time=clock.wall())
    state = coll.start(job)
    os.makedirs(os.path.join(cfg.paths.state_dir, "jobs"), exist_ok=True)
    with open(os.path.join(cfg.paths.state_dir, "jobs", "1.json"), "w") as fh:
        json.dump({"job_id": 1, "start_time": job.start_time, "start": state}, fh)
    busy = {"kernel_pct": 90, "power_mw": 500_000.0, "memory_used_bytes": 40 * GiB,
            "gpm": {"sm_active": 70, "tensor_active": 40, "dram_active": 30, "sm_occupancy": 30, "fp32_active": 5,
                    "fp16_active": 1, "fp64_active": 0, "hmma_active": 40, "imma_active": 0, "dfma_active": 0}}
    for _ in range(240):  # 20 minutes of 5-s readings
        clock.advance(5.0)
        for u in uuids:
            fake.set(u, **busy)
        agent.tick()
    job.end_time = clock.wall()
    m = coll.stop(job, state)
    rec = {"schema": 1, "cluster": "bench", "node": "template", "job_id": 1, "array_job_id": None,
           "array_task_id": None, "het_job_id": None, "het_job_offset": None, "user": "u", "uid": 10000,
           "account": "a", "partition": "gpu", "start_time": job.start_time, "end_time": job.end_time,
           "exit_code": 0, "signal": 0, "backend": m.backend, "reason": m.reason, "gpus": m.gpus,
           "written_at": job.end_time, "writer": "slurm-gpueff 0.1.0", "run": 0, "sluid": None}
    return record.validate(rec)


def timeline_length(elapsed_s: float) -> int:
    """Points the agent gives a job of ``elapsed_s``: one a minute, neighbours merged past MAX_POINTS."""
    n = max(1, int(elapsed_s // TIMELINE_STEP_S))
    return n if n <= MAX_POINTS else math.ceil(n / math.ceil(n / MAX_POINTS))


class Shapes:
    """The record maker: :meth:`record` for any job, from a template made once (:func:`agent_template`)."""

    def __init__(self) -> None:
        tmpl = agent_template(8)
        self.job = {k: v for k, v in tmpl.items() if k != "gpus"}
        self.gpu = tmpl["gpus"][0]
        assert self.gpu["source"] == "nvml-gpm" and self.gpu.get("window"), self.gpu

    def record(self, job_id: int, *, cluster: str, node: str, gpus: int, start: float, end: float, user: str,
               uid: int, account: str, live: bool, array: tuple[int, int] | None = None, run: int = 0,
               sluid: str | None = None, first_index: int = 0) -> dict[str, Any]:
        rng = random.Random(job_id * 7919 + first_index)
        rec = copy.deepcopy(self.job)
        elapsed = max(1.0, end - start)
        rec.update(cluster=cluster, node=node, job_id=job_id, user=user, uid=uid, account=account,
                   start_time=start, end_time=end, written_at=end, run=run, sluid=sluid,
                   array_job_id=array[0] if array else None, array_task_id=array[1] if array else None)
        if live:
            rec.update(live=True, exit_code=None, signal=None)
        else:
            rec.update(exit_code=rng.choice((0, 0, 0, 0, 1)), signal=0)
        k = rng.random()
        s, occ = k * rng.random(), rng.random()
        t = s * rng.random()
        n_points = timeline_length(elapsed)
        step = elapsed / n_points
        out = []
        for i in range(gpus):
            g = copy.deepcopy(self.gpu)
            idx = first_index + i
            g.update(index=idx, minor=idx, uuid=f"GPU-{abs(hash((node, idx))) % 16**8:08x}-0000-4000-8000-{idx:012x}",
                     pci_bus_id=f"00000000:{0x18 + 0x10 * idx:02X}:00.0")
            g.update(kernel_active=k, sm_active=s, sm_occupancy=s * occ, tensor_active=t, hmma_active=t,
                     dram_active=s * rng.random(), fp32_active=s * rng.random() * 0.2, fp16_active=0.0,
                     fp64_active=0.0, imma_active=0.0, dfma_active=0.0,
                     memory_used_peak_bytes=rng.randrange(1 << 30, g["memory_total_bytes"]),
                     power_mean_w=70 + 630 * k, energy_j=(70 + 630 * k) * elapsed, samples=int(elapsed // 5),
                     window_s=elapsed, measured_s=elapsed)
            g["window"] = dict(g["window"], start=start, end=end)
            g["timeline"] = [[round(step * (p + 0.5), 1), *(round(min(1.0, v * rng.uniform(0.8, 1.2)), 4)
                                                            for v in (k, s, t))] for p in range(n_points)]
            out.append(g)
        rec["gpus"] = out
        return rec
