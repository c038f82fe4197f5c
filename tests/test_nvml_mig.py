"""Per-MIG-slice figures on the nvml backend: the real agent and hook-side collector, the GPU mocked.

The GPU is the only mock (tests/fake_mig.py: GPUs in MIG mode, scripted per GPU instance); the agent's
per-slice integrals, its state and timeline files, the Prolog's job file and NvmlCollector are real.
A job on one slice must get that slice's figures, never its neighbour's or the whole GPU's.
"""

from __future__ import annotations

import json
import os

from fake_gpus import FakeClock, GiB, close, make_config, make_dev_dir
from fake_mig import FakeMigSampler, mig_dev, mig_parent

from slurm_gpueff import record, statedir
from slurm_gpueff.collectors.base import JobContext
from slurm_gpueff.collectors.nvml import NvmlCollector
from slurm_gpueff.node.agent import Agent
from slurm_gpueff.node.nvml_sampler import NO_GPM_REASON

P = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
S1 = mig_dev(P, 1, profile="3g.40gb", mem_gib=40)
S2 = mig_dev(P, 2, profile="2g.20gb", mem_gib=20)
BUSY1 = {"sm_active": 40, "tensor_active": 30, "dram_active": 10, "sm_occupancy": 20, "fp16_active": 25,
         "fp32_active": 5, "fp64_active": 0, "hmma_active": 30, "imma_active": 0, "dfma_active": 0}
BUSY2 = {"sm_active": 90, "tensor_active": 80, "dram_active": 60, "sm_occupancy": 70, "fp16_active": 75,
         "fp32_active": 15, "fp64_active": 0, "hmma_active": 75, "imma_active": 5, "dfma_active": 0}


class MigNode:
    def __init__(self, tmp_path, parents, devices):
        self.clock = FakeClock()
        self.fake = FakeMigSampler(self.clock, parents, devices)
        self.cfg = make_config(tmp_path)
        self.agent = Agent(self.cfg, self.fake, wall_clock=self.clock.wall, host="node1")
        self.agent.open()
        self.coll = NvmlCollector(self.cfg, dev_dir=make_dev_dir(tmp_path, []), now=self.clock.wall)

    def ticks(self, n, dt=5.0):
        for _ in range(n):
            self.clock.advance(dt)
            self.agent.tick()

    def job(self, job_id, *slices):
        env = {"SLURM_JOB_GPUS": ",".join(str(i) for i, _ in enumerate(slices)),
               "CUDA_VISIBLE_DEVICES": ",".join(s.uuid for s in slices)}
        return JobContext(job_id, "node1", "c", list(range(len(slices))), start_time=self.clock.wall(), env=env)

    def prolog(self, job):
        st = self.coll.start(job)
        os.makedirs(os.path.join(self.cfg.paths.state_dir, "jobs"), exist_ok=True)
        with open(os.path.join(self.cfg.paths.state_dir, "jobs", f"{job.job_id}.json"), "w") as fh:
            json.dump({"job_id": job.job_id, "start": st}, fh)
        return json.loads(json.dumps(st))

    def epilog(self, job, st):
        m = self.coll.stop(job, st)
        os.unlink(os.path.join(self.cfg.paths.state_dir, "jobs", f"{job.job_id}.json"))
        record.validate({"schema": 1, "cluster": "c", "node": "node1", "job_id": job.job_id, "start_time": 1.0e9,
                         "end_time": 1.0e9 + 60, "backend": m.backend, "gpus": m.gpus})
        return m


def test_two_slices_each_job_gets_its_own_slice(tmp_path):
    n = MigNode(tmp_path, [mig_parent(P)], {P: [S1, S2]})
    n.fake.set(P, gpm={"sm_active": 70, "tensor_active": 55}, power_mw=400_000.0)  # whole-GPU readings
    n.fake.set_slice(P, 1, gpm={"sm_active": 5}, memory_used_bytes=30 * GiB)  # before the job: not counted
    n.fake.set_slice(P, 2, gpm=BUSY2, memory_used_bytes=9 * GiB)
    n.ticks(3)
    with open(statedir.agent_state(n.cfg.paths.state_dir)) as fh:
        inv = json.load(fh)["mig"]
    assert inv[S1.uuid] == {"parent_uuid": P, "parent_minor": 0, "gi_id": 1, "ci_id": 0, "profile": "3g.40gb",
                            "memory_total_bytes": 40 * GiB, "gen": inv[S1.uuid]["gen"]}
    a, b = n.job(11, S1), n.job(12, S2)
    sa, sb = n.prolog(a), n.prolog(b)
    assert sa["uuids"] == [S1.uuid] and sa["mig"]["0"]["snapshot"]["gen"] == inv[S1.uuid]["gen"]
    n.fake.set_slice(P, 1, gpm=BUSY1, memory_used_bytes=8 * GiB)
    n.ticks(4)
    n.fake.set_slice(P, 1, gpm=dict(BUSY1, sm_active=10), memory_used_bytes=7 * GiB)
    n.ticks(2, dt=2.5)
    ma, mb = n.epilog(a, sa), n.epilog(b, sb)
    assert ma.backend == "nvml-gpm" and ma.reason is None
    (g,) = ma.gpus
    assert (g["index"], g["uuid"], g["mig_uuid"], g["mig_gi_id"], g["mig_ci_id"], g["mig_profile"]) == (
        0, P, S1.uuid, 1, 0, "3g.40gb")
    assert g["memory_total_bytes"] == 40 * GiB and g["source"] == "nvml-gpm" and g["samples"] == 6
    assert close(g["sm_active"], (20 * 0.40 + 5 * 0.10) / 25, 1e-6)  # slice 1's, not 0.9 (slice 2) or 0.7 (GPU)
    assert close(g["tensor_active"], 0.30, 1e-6) and close(g["fp16_active"], 0.25, 1e-6)
    assert g["fp64_active"] == 0.0
    assert g["memory_used_peak_bytes"] == 8 * GiB  # slice 1's peak in the job: not 30 GiB before, not slice 2's
    assert g["kernel_active"] is None and "utilization.gpu is whole-GPU only" in g["missing"]["kernel_active"]
    for m in ("energy_j", "power_mean_w"):
        assert g[m] is None and "whole-GPU only" in g["missing"][m]
    assert set(g["missing"]) == {"kernel_active", "energy_j", "power_mean_w"}
    assert g["timeline"] and all(p[1] is None for p in g["timeline"]) and g["timeline"][0][2] is not None
    (h,) = mb.gpus
    assert (h["mig_gi_id"], h["mig_profile"]) == (2, "2g.20gb")
    assert close(h["sm_active"], 0.90, 1e-6) and close(h["tensor_active"], 0.80, 1e-6)
    assert h["memory_used_peak_bytes"] == 9 * GiB


def test_slice_gone_or_recreated_between_prolog_and_epilog(tmp_path):
    n = MigNode(tmp_path, [mig_parent(P)], {P: [S1, S2]})
    n.fake.set_slice(P, 1, gpm=BUSY1)
    n.fake.set_slice(P, 2, gpm=BUSY2)
    n.ticks(2)
    a, b = n.job(21, S1), n.job(22, S2)
    sa, sb = n.prolog(a), n.prolog(b)
    n.ticks(2)
    # MIG reconfigured: GI 1 destroyed; GI 2 destroyed and re-created (same id, new MIG UUID).
    n.fake.reconfigure(P, [mig_dev(P, 2, uuid="MIG-99999999-0000-5000-8000-000000000002")])
    n.ticks(2)
    (g,) = n.epilog(a, sa).gpus
    assert g["mig_gi_id"] == 1 and g["uuid"] == P  # identity kept from the Prolog
    assert g["sm_active"] is None and g["memory_used_peak_bytes"] is None
    assert "MIG slice gone at job end" in g["missing"]["sm_active"] and "reconfigured" in g["missing"]["sm_active"]
    assert "whole-GPU only" in g["missing"]["kernel_active"]
    (h,) = n.epilog(b, sb).gpus
    assert h["sm_active"] is None and "destroyed and re-created" in h["missing"]["tensor_active"]
    assert "not comparable" in h["missing"]["memory_used_peak_bytes"]


def test_shared_gpu_instance_and_pre_hopper_mig(tmp_path):
    """Two compute instances in one GPU instance cannot be told apart; an A100 in MIG mode has no GPM
    but its slice's peak memory is still measured."""
    a100 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"
    c0, c1 = mig_dev(P, 3, ci=0, profile="1c.3g.40gb"), mig_dev(P, 3, ci=1, profile="1c.3g.40gb")
    d = mig_dev(a100, 5, profile="1g.5gb", mem_gib=5)
    n = MigNode(tmp_path, [mig_parent(P), mig_parent(a100, 1, gpm=False)], {P: [c0, c1], a100: [d]})
    n.fake.set_slice(P, 3, gpm=BUSY1)
    n.fake.set_slice(a100, 5, memory_used_bytes=3 * GiB)
    n.ticks(2)
    j1, j2 = n.job(31, c0), n.job(32, d)
    s1, s2 = n.prolog(j1), n.prolog(j2)
    n.ticks(3)
    (g,) = n.epilog(j1, s1).gpus
    assert (g["mig_gi_id"], g["mig_ci_id"]) == (3, 0) and g["sm_active"] is None
    assert "shared by 2 compute instances" in g["missing"]["sm_active"]
    m2 = n.epilog(j2, s2)
    (h,) = m2.gpus
    assert m2.backend == "nvml" and h["source"] == "nvml" and h["uuid"] == a100
    assert h["sm_active"] is None and h["missing"]["sm_active"] == NO_GPM_REASON
    assert h["memory_used_peak_bytes"] == 3 * GiB and h["memory_total_bytes"] == 5 * GiB


def test_missing_prolog_voids_and_agent_restart_keeps_slice_figures(tmp_path):
    n = MigNode(tmp_path, [mig_parent(P)], {P: [S1]})
    n.fake.set_slice(P, 1, gpm=BUSY1)
    n.ticks(2)
    j = n.job(41, S1)
    st = n.prolog(j)
    n.ticks(2)
    m = n.coll.stop(j, None)  # Prolog state lost: identity still resolved from the agent's inventory
    (g,) = m.gpus
    assert g["mig_gi_id"] == 1 and g["uuid"] == P and g["sm_active"] is None
    assert "Prolog did not run" in g["missing"]["sm_active"]
    fake = FakeMigSampler(n.clock, [mig_parent(P)], {P: [S1]})
    fake.energy = dict(n.fake.energy)  # the same GPU: its energy counter went on
    fake.set_slice(P, 1, gpm=BUSY1)
    again = Agent(n.cfg, fake, wall_clock=n.clock.wall)
    again.open()  # resumes the GPU instance's counters: same boot, same MIG devices
    n.clock.advance(5)
    again.tick()
    n.clock.advance(5)
    again.tick()
    m = n.coll.stop(j, st)
    (g,) = m.gpus
    assert m.reason is None and g["sm_active"] is not None and g["measured_s"] < g["window_s"]
    assert g["window"]["gaps"][0][2] == "agent not running (killed or crashed)"


def test_real_sampler_mig_calls_against_a_fake_pynvml(monkeypatch):
    """NvmlSampler's own MIG code (enumeration, per-GPU-instance GPM buffers, re-creation) against the
    pynvml stand-in of tests/fake_pynvml_mig.py (the GPU mock): right handles, right GI ids, no mixing."""
    import sys

    import fake_pynvml_mig

    from slurm_gpueff.node import nvml_sampler
    from slurm_gpueff.node.nvml_sampler import NvmlSampler

    monkeypatch.setattr(nvml_sampler, "GPM_SKIP_S", 0.0)  # samples back to back (the real minimum is tested apart)
    gis = {1: {"uuid": "MIG-1", "ci": 0, "name": "NVIDIA H100 80GB HBM3 MIG 3g.40gb", "total": 40 << 30,
               "used": 5 << 30, "gpm": {2: 40.0, 5: 30.0}},
           2: {"uuid": "MIG-2", "ci": 0, "name": "NVIDIA H100 80GB HBM3 MIG 2g.20gb", "total": 20 << 30,
               "used": 9 << 30, "gpm": {2: 90.0, 5: 80.0}}}
    nv = fake_pynvml_mig.make(P, gis)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    smp = NvmlSampler()
    (info,) = smp.open()
    assert info.mig_enabled and info.uuid == P
    (s,) = smp.sample(read_energy=True)
    assert s.kernel_pct is None  # utilization NotSupported in MIG mode: missing, not 0
    assert [(d.uuid, d.gi_id, d.ci_id, d.profile, d.memory_total_bytes) for d in s.mig_devices] == [
        ("MIG-1", 1, 0, "3g.40gb", 40 << 30), ("MIG-2", 2, 0, "2g.20gb", 20 << 30)]
    assert s.mig[1].gpm is None and s.mig[1].memory_used_bytes == 5 << 30  # first GI sample: no interval yet
    (s,) = smp.sample(read_energy=False)
    assert s.mig[1].gpm["sm_active"] == 40.0 and s.mig[1].gpm["tensor_active"] == 30.0
    assert s.mig[2].gpm["sm_active"] == 90.0 and s.mig[1].gpm_dt > 0
    # GI 1 destroyed, GI 2 re-created (new MIG UUID): its old buffer must not be differenced with the new GI.
    del gis[1]
    gis[2] = dict(gis[2], uuid="MIG-2b")
    (s,) = smp.sample(read_energy=False)
    assert sorted(s.mig) == [2] and s.mig[2].gpm is None and not s.mig[2].errors
    assert [d.uuid for d in s.mig_devices] == ["MIG-2b"]
    (s,) = smp.sample(read_energy=False)
    assert s.mig[2].gpm["sm_active"] == 90.0 and not s.errors.get("gpm")
    smp.close()
    assert nv.allocated == set()  # every GPM buffer freed (device + per-GI ones)
