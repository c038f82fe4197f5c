"""The hook-side nvml collector against the real agent driven by a fake GPU (tests/fake_gpus.py).

The GPU is the only mock: a scripted sampler feeds the real agent, which writes the real state and
timeline files that NvmlCollector reads. Every failure must give None figures with a reason, never an
exception and never a 0 standing in for "unknown".
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from fake_gpus import FakeClock, FakeSampler, GiB, ampere, close, hopper, make_config, make_dev_dir

from slurm_gpueff import record, statedir
from slurm_gpueff.collectors.base import JobContext
from slurm_gpueff.collectors.nvml import NvmlCollector
from slurm_gpueff.node.agent import Agent
from slurm_gpueff.node.nvml_sampler import NO_GPM_REASON

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"
U3 = "GPU-dddddddd-3333-3333-3333-333333333333"


class Node:
    """A node: fake GPUs, the real agent, a /dev stand-in, the real collector, one shared fake clock."""

    def __init__(self, tmp_path, gpus, minors, **agent_cfg):
        self.tmp = tmp_path
        self.clock = FakeClock()
        self.fake = FakeSampler(self.clock, gpus)
        self.cfg = make_config(tmp_path, **agent_cfg)
        self.agent = Agent(self.cfg, self.fake, wall_clock=self.clock.wall, host="node1")
        self.agent.open()
        self.dev = make_dev_dir(tmp_path, minors)
        self.coll = NvmlCollector(self.cfg, dev_dir=self.dev, now=self.clock.wall)

    def ticks(self, n, dt=5.0, **values):
        for _ in range(n):
            self.clock.advance(dt)
            for u, v in values.items():
                self.fake.set(u, **v)
            self.agent.tick()

    def prolog(self, job):
        """What the hook does: start() then save the job file the agent watches."""
        st = self.coll.start(job)
        os.makedirs(os.path.join(self.cfg.paths.state_dir, "jobs"), exist_ok=True)
        with open(os.path.join(self.cfg.paths.state_dir, "jobs", f"{job.job_id}.json"), "w") as fh:
            json.dump({"job_id": job.job_id, "start_time": job.start_time, "start": st}, fh)
        return json.loads(json.dumps(st))  # it must survive JSON


def _job(node, idx, job_id=1001):
    return JobContext(job_id, "node1", "c", idx, start_time=node.clock.wall())


def _as_record(job, m):
    rec = {"schema": 1, "cluster": "c", "node": "node1", "job_id": job.job_id, "start_time": 1.0e9,
           "end_time": 1.0e9 + 60, "backend": m.backend, "gpus": m.gpus}
    return record.validate(rec)


def test_job_window_figures_are_exact(tmp_path):
    # NVML order != minor order: GPU U3 has minor 3 and Slurm index 2 (devices 0, 1, 3).
    n = Node(tmp_path, [hopper(U0, 0, 0), hopper(U3, 1, 3), hopper(U1, 2, 1)], [0, 1, 3])
    busy = {"kernel_pct": 100, "power_mw": 300_000.0,
            "gpm": {"sm_active": 80, "tensor_active": 60, "dram_active": 20, "sm_occupancy": 30,
                    "fp32_active": 5, "fp16_active": 0, "fp64_active": 0, "hmma_active": 60, "imma_active": 0,
                    "dfma_active": 0}}
    n.ticks(3, **{U3: {"kernel_pct": 0, "memory_used_bytes": 60 * GiB}})  # before the job
    job = _job(n, [2])
    st = n.prolog(job)
    assert st["uuids"] == [U3] and st["gpus"]["2"]["minor"] == 3
    e0 = n.fake.energy[U3]
    n.ticks(4, **{U3: dict(busy, memory_used_bytes=10 * GiB)})
    n.ticks(2, dt=2.5, **{U3: dict(busy, kernel_pct=50, memory_used_bytes=12 * GiB,
                                   gpm=dict(busy["gpm"], sm_active=20))})
    job.end_time = n.clock.wall()
    m = n.coll.stop(job, st)
    assert m.backend == "nvml-gpm" and m.reason is None
    (g,) = m.gpus
    assert (g["index"], g["minor"], g["uuid"], g["source"]) == (2, 3, U3, "nvml-gpm")
    assert g["model"] == "NVIDIA H100 80GB HBM3" and g["memory_total_bytes"] == 80 * GiB
    assert g["samples"] == 6
    assert close(g["kernel_active"], (20 * 1.0 + 5 * 0.5) / 25, 1e-6)
    assert close(g["sm_active"], (20 * 0.8 + 5 * 0.2) / 25, 1e-6)
    assert close(g["tensor_active"], 0.6, 1e-6) and close(g["dram_active"], 0.2, 1e-6)
    assert g["fp64_active"] == 0.0  # measured zero is 0, not None
    assert close(g["power_mean_w"], 300.0, 1e-6)
    # Energy: counter difference over the window (300 W x 25 s).
    assert close(g["energy_j"], (n.fake.energy[U3] - e0) / 1000, 1e-3) and close(g["energy_j"], 7500.0, 1e-3)
    assert g["memory_used_peak_bytes"] == 12 * GiB  # not the 60 GiB from before the Prolog
    assert g["missing"] == {}
    assert len(g["timeline"]) >= 1 and g["timeline"][0][1] is not None
    _as_record(job, m)


def test_agent_not_running(tmp_path):
    cfg = make_config(tmp_path)
    coll = NvmlCollector(cfg, dev_dir=make_dev_dir(tmp_path, [0, 1]))
    job = JobContext(7, "node1", "c", [0, 1], start_time=1.0e9)
    st = coll.start(job)
    assert "not running" in st["error"] and st["uuids"] == []
    m = coll.stop(job, st)
    assert m.backend == "nvml" and "gpueff agent not running" in m.reason
    for g in m.gpus:
        assert all(g[k] is None for k in record.METRICS)
        assert "gpueff agent not running" in g["missing"]["sm_active"]
        assert g["samples"] == 0
    _as_record(job, m)


def test_agent_hung_at_job_end_keeps_the_measured_part(tmp_path):
    """A stale agent at the Epilog: the figures cover the job up to its last reading, and the window
    says the rest was not measured (it used to void the whole job)."""
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    n.ticks(2, **{U0: {"kernel_pct": 60}})
    n.clock.advance(120)  # the agent hangs for two minutes
    m = n.coll.stop(job, st)
    (g,) = m.gpus
    assert close(g["kernel_active"], 0.6) and g["uuid"] == U0
    assert (g["window_s"], g["measured_s"]) == (130.0, 10.0)
    (gap,) = g["window"]["gaps"]
    assert gap[1] - gap[0] == 120.0 and gap[2] == "agent not running at job end"
    _as_record(job, m)


def test_agent_stopped_during_job(tmp_path):
    """A cleanly stopped agent (its last state says so) still gives the job what it measured."""
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    n.ticks(1, **{U0: {"kernel_pct": 30}})
    n.agent.close()
    n.clock.advance(20)
    m = n.coll.stop(job, st)
    (g,) = m.gpus
    assert close(g["kernel_active"], 0.3) and g["measured_s"] == 5.0 and g["window_s"] == 25.0


def test_gpu_index_without_device_and_no_start_state(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0, 5])
    st = n.prolog(job)
    assert "no /dev/nvidiaN" in st["gpus"]["5"]["error"]
    n.ticks(3, **{U0: {"kernel_pct": 70}})
    m = n.coll.stop(job, st)
    g0, g5 = m.gpus
    assert close(g0["kernel_active"], 0.7) and g5["kernel_active"] is None
    assert "Slurm GPU index 5 has no /dev/nvidiaN" in g5["missing"]["kernel_active"]
    # No Prolog state at all: nothing measured, and it says so.
    m2 = n.coll.stop(job, None)
    assert "Prolog did not run" in m2.reason
    assert all(g["kernel_active"] is None and g["energy_j"] is None for g in m2.gpus)
    assert m2.gpus[0]["uuid"] == U0  # identity is still known from the agent


def test_minor_not_seen_by_agent(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0, 1])
    n.ticks(2)
    job = _job(n, [1])
    st = n.prolog(job)
    n.ticks(2)
    m = n.coll.stop(job, st)
    assert "no GPU with minor number 1" in m.gpus[0]["missing"]["kernel_active"]


def test_job_shorter_than_one_interval(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    n.clock.advance(2)  # Epilog before the next tick
    m = n.coll.stop(job, st)
    g = m.gpus[0]
    assert g["samples"] == 0 and g["kernel_active"] is None and g["energy_j"] is None
    assert "shorter than one sampling interval (5 s)" in g["missing"]["kernel_active"]
    assert "shorter than one sampling interval" in g["missing"]["memory_used_peak_bytes"]
    assert g["timeline"] == []
    _as_record(job, m)


def test_pre_hopper_gpu_kernel_activity_only(tmp_path):
    n = Node(tmp_path, [ampere(U1)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    n.ticks(4, **{U1: {"kernel_pct": 90, "memory_used_bytes": 7 * GiB}})
    m = n.coll.stop(job, st)
    g = m.gpus[0]
    assert m.backend == "nvml" and g["source"] == "nvml" and m.reason == NO_GPM_REASON
    assert close(g["kernel_active"], 0.9) and g["memory_used_peak_bytes"] == 7 * GiB
    for k in ("sm_active", "tensor_active", "dram_active", "sm_occupancy", "fp32_active"):
        assert g[k] is None and g["missing"][k] == NO_GPM_REASON
    assert g["timeline"] and g["timeline"][0][2] is None  # [t, kernel, sm=None, tensor=None]
    _as_record(job, m)


def test_long_job_timeline_from_files(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0], timeline_interval_s=60.0)
    n.ticks(1)
    job = _job(n, [0])
    st = n.prolog(job)
    for k in (20, 80, 50, 100, 0):  # five minutes, one kernel level each
        n.ticks(12, **{U0: {"kernel_pct": k, "gpm": {"sm_active": k / 4}}})
    m = n.coll.stop(job, st)
    tl = m.gpus[0]["timeline"]
    assert [p[1] for p in tl] == [0.2, 0.8, 0.5, 1.0, 0.0]
    assert [p[2] for p in tl] == [0.05, 0.2, 0.125, 0.25, 0.0]
    assert [p[0] for p in tl] == [30.0, 90.0, 150.0, 210.0, 270.0]
    assert close(m.gpus[0]["kernel_active"], 0.5)


def test_state_file_corrupt_or_foreign(tmp_path):
    cfg = make_config(tmp_path)
    os.makedirs(os.path.dirname(statedir.agent_state(cfg.paths.state_dir)))
    with open(statedir.agent_state(cfg.paths.state_dir), "w") as fh:
        fh.write("{half a file")
    coll = NvmlCollector(cfg, dev_dir=make_dev_dir(tmp_path, [0]))
    job = JobContext(9, "node1", "c", [0])
    m = coll.stop(job, coll.start(job))
    assert "unreadable" in m.reason and m.gpus[0]["kernel_active"] is None


@pytest.mark.process
def test_collector_module_does_not_import_pynvml(repo_root):
    import subprocess

    code = ("import sys; import slurm_gpueff.collectors.nvml, slurm_gpueff.node.agent; "
            "print('pynvml' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("backend", ["nvml", "auto"])
def test_select_returns_the_nvml_collector(tmp_path, backend):
    from slurm_gpueff.collectors.choice import get_collector
    from slurm_gpueff.config import Config

    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(1)
    n.cfg = Config({**n.cfg.as_dict(), "collector": {**n.cfg.collector.as_dict(), "backend": backend}})
    assert isinstance(get_collector(n.cfg), NvmlCollector)
