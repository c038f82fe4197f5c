"""The nvml backend on a real NVIDIA GPU (marker gpu): no mocks at all.

Skips cleanly without an NVIDIA GPU (conftest), without GPM (pre-Hopper) or without CuPy. The claim it
checks is the one this product exists for: a one-block spin kernel reads ~100 % kernel-active
("GPU utilization") but < 2 % SM-active.
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
from gpu_kernels import SPIN_SRC, clock_khz  # noqa: E402  (the same kernel bench/gpu_validate.py runs)


def _gpm_gpu0() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            return bool(pynvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


@pytest.fixture
def node(tmp_path):
    """The real agent on the real NvmlSampler, 1 s interval, and a collector mapping Slurm index 0."""
    from slurm_gpueff.collectors.base import device_minors
    from slurm_gpueff.collectors.nvml import NvmlCollector
    from slurm_gpueff.config import Config
    from slurm_gpueff.node.agent import Agent
    from slurm_gpueff.node.nvml_sampler import NvmlSampler

    cfg = Config({"paths": {"state_dir": str(tmp_path / "state")}, "agent": {"interval_s": 1.0}})
    agent = Agent(cfg, NvmlSampler())
    agent.open()
    gpu0 = next(g for g in agent.gpus.values() if g.info.index == 0)
    dev = "/dev"
    if gpu0.info.minor not in device_minors(dev):  # VMs without /dev/nvidiaN: a stand-in
        dev = str(tmp_path / "dev")
        os.makedirs(dev)
        for g in agent.gpus.values():
            open(os.path.join(dev, f"nvidia{g.info.minor}"), "w").close()
    slurm_idx = device_minors(dev).index(gpu0.info.minor)
    yield agent, NvmlCollector(cfg, dev_dir=dev), slurm_idx, gpu0.info
    agent.close()


def _ticks(agent, seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(1.0)
        agent.tick()


def test_real_sampler_reads_identity_and_metrics(node):
    agent, _, _, info = node
    assert info.uuid.startswith("GPU-") and info.minor is not None and info.memory_total_bytes > 0
    agent.tick()
    _ticks(agent, 2.5)
    agent.tick(requested=True)  # as a hook's reading: GPM figures come at requested readings (and every 30 s)
    with open(os.path.join(agent.state_dir, "agent", "state.json")) as fh:
        st = json.load(fh)
    g = st["gpus"][info.uuid]
    assert g["count"]["kernel_active"] >= 1 and g["count"]["power_w"] >= 2
    assert g["memory_used_bytes"] is not None and g["energy_mj"] is not None and g["energy_mj"] > 0
    if info.gpm_supported:
        assert g["count"]["sm_active"] >= 1 and g["covered_s"]["sm_active"] >= 2.5


@pytest.mark.skipif(not _gpm_gpu0(), reason="GPU 0 has no GPM (pre-Hopper) or NVML absent")
def test_spin_kernel_is_kernel_active_but_not_sm_active(node):
    cp = pytest.importorskip("cupy")
    from slurm_gpueff.collectors.base import JobContext

    agent, coll, slurm_idx, info = node
    cp.cuda.Device(0).use()
    kern = cp.RawKernel(SPIN_SRC, "spin")
    kern((1,), (1,), (cp.int64(int(clock_khz(cp) * 1000 * 9.0)),))  # one block, one thread, ~9 s (or more)
    agent.tick()
    _ticks(agent, 2.2)  # warm: the window starts with the kernel already running
    job = JobContext(77, "n", "c", [slurm_idx], start_time=time.time())
    agent.tick(requested=True)  # the reading the Prolog asks the agent for (no socket here)
    st = coll.start(job)
    assert st["uuids"] == [info.uuid]
    _ticks(agent, 4.2)
    agent.tick(requested=True)  # and the Epilog's
    m = coll.stop(job, st)
    cp.cuda.Device(0).synchronize()
    g = m.gpus[0]
    assert m.backend == "nvml-gpm" and g["source"] == "nvml-gpm", m.reason
    assert g["samples"] >= 3
    assert g["kernel_active"] >= 0.9, g
    assert g["sm_active"] is not None and g["sm_active"] < 0.02, g
    assert g["tensor_active"] is not None and g["tensor_active"] < 0.01
    assert g["energy_j"] is not None and g["energy_j"] > 0 and g["power_mean_w"] > 0
