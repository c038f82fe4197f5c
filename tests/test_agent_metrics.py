"""The node agent's live per-GPU gauges ([agent] metrics_port), scraped over real HTTP on loopback and
parsed with prometheus_client's own text parser. The GPUs are the GPU mock (tests/fake_gpus.py): no GPU
here; on a GPU the same collector reads the real sampler's readings (bench/gpu_validate.py covers those).
"""

from __future__ import annotations

import logging
import socket
import urllib.request

import pytest
from fake_gpus import FakeClock, FakeSampler, GiB, ampere, hopper, make_config
from prometheus_client.parser import text_string_to_metric_families

from slurm_gpueff.config import Config
from slurm_gpueff.errors import ConfigError
from slurm_gpueff.node.agent import Agent
from slurm_gpueff.node.run import run_agent, serve_metrics

H, A = "GPU-hhhhhhhh-0000-0000-0000-000000000000", "GPU-aaaaaaaa-1111-1111-1111-111111111111"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, dict[tuple, float]]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(body):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def key(uuid: str, minor: int, model: str) -> tuple:
    return tuple(sorted({"uuid": uuid, "minor": str(minor), "model": model}.items()))


def test_gauges_are_the_last_tick_and_unmeasured_figures_have_no_series(tmp_path):
    clock = FakeClock()
    fake = FakeSampler(clock, [hopper(H, 0), ampere(A, 1)])
    agent = Agent(make_config(tmp_path), fake, wall_clock=clock.wall)
    agent.open()
    fake.set(H, kernel_pct=100.0, power_mw=120_000.0, memory_used_bytes=3 * GiB,
             gpm={"sm_active": 0.76, "tensor_active": 0.0, "dram_active": 12.5})
    fake.set(A, kernel_pct=40.0, power_mw=250_000.0, memory_used_bytes=9 * GiB)
    for _ in range(3):
        agent.tick()
        clock.advance(5.0)
    port = free_port()
    server, _thread = serve_metrics(agent, "127.0.0.1", port)
    try:
        m = scrape(port)
    finally:
        server.shutdown()
        server.server_close()
        agent.close()
    h, a = key(H, 0, "NVIDIA H100 80GB HBM3"), key(A, 1, "NVIDIA A100-SXM4-40GB")
    assert m["gpueff_gpu_kernel_active_ratio"] == {h: 1.0, a: 0.4}  # nvidia-smi's "GPU utilization"
    assert m["gpueff_gpu_sm_active_ratio"] == {h: pytest.approx(0.0076)}  # the A100 has no GPM: no series
    assert m["gpueff_gpu_dram_active_ratio"] == {h: pytest.approx(0.125)}
    assert "gpueff_gpu_fp64_active_ratio" not in m  # never read on either GPU: no invented 0
    assert m["gpueff_gpu_power_watts"] == {h: 120.0, a: 250.0}
    assert m["gpueff_gpu_memory_used_bytes"] == {h: 3 * GiB, a: 9 * GiB}
    assert m["gpueff_gpu_memory_total_bytes"][a] == 40 * GiB
    est = {g.info.uuid: g.energy_est_mj() / 1000.0 for g in agent.gpus.values()}
    assert m["gpueff_gpu_energy_joules_total"] == {h: pytest.approx(est[H]), a: pytest.approx(est[A])}
    assert m["gpueff_agent_ticks_total"][()] == 3
    assert m["gpueff_agent_last_tick_timestamp_seconds"][()] == agent.updated
    labels = {k for fam in m.values() for lab in fam for k, _ in lab}
    assert labels <= {"uuid", "minor", "model"}  # bounded: no job ids


def test_run_agent_serves_while_sampling_and_frees_the_port(tmp_path):
    port = free_port()
    cfg = make_config(tmp_path, metrics_port=port)
    clock = FakeClock()
    assert run_agent(cfg, once=True, sampler=FakeSampler(clock, [hopper(H, 0)])) == 0
    with socket.socket() as s:  # shut down with the agent: the port is free again
        s.bind(("127.0.0.1", port))


def test_a_taken_port_does_not_stop_sampling(tmp_path, caplog):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        cfg = make_config(tmp_path, metrics_port=busy.getsockname()[1])
        fake = FakeSampler(FakeClock(), [hopper(H, 0)])
        with caplog.at_level(logging.ERROR, logger="slurm_gpueff.agent"):
            assert run_agent(cfg, once=True, sampler=fake) == 0
    assert fake.calls == 1 and "sampling goes on without it" in caplog.text


def test_metrics_port_must_be_a_port():
    with pytest.raises(ConfigError, match="agent.metrics_port"):
        Config({"agent": {"metrics_port": 70000}}, source="<test>")
