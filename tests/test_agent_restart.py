"""The agent's counters survive its own restart; only a reboot or a GPU reset breaks them, and says so.

The GPU is the only mock (tests/fake_gpus.py, a scripted sampler): the real agent writes the real state
file, a second real agent resumes from it, and the real hook-side collector differences the counters.
"""

from __future__ import annotations

import os

import pytest
from fake_gpus import FakeSampler, close, hopper
from test_nvml_collector import U0, Node, _as_record, _job

from slurm_gpueff.collectors.window import measured_s
from slurm_gpueff.node import resume as agent_resume
from slurm_gpueff.node.agent import Agent

BUSY = {"kernel_pct": 100, "power_mw": 400_000.0, "gpm": {"sm_active": 80, "tensor_active": 60}}
HALF = {"kernel_pct": 50, "power_mw": 200_000.0, "gpm": {"sm_active": 20, "tensor_active": 10}}


def _restart(n: Node, down_s: float, values: dict[str, object], *, boot: str | None = None,
             energy_back: bool = False) -> Agent:
    """Kill the agent (no final state: as kill -9), keep the GPU running ``down_s`` s, start a new agent."""
    fake = FakeSampler(n.clock, [hopper(U0)])
    fake.energy = dict(n.fake.energy)
    fake.energy[U0] += 0 if energy_back else values["power_mw"] * down_s  # type: ignore[operator]
    if energy_back:
        fake.energy[U0] = 1_000.0  # the counter restarted: GPU reset or driver reload
    fake.set(U0, **values)
    n.clock.advance(down_s)
    again = Agent(n.cfg, fake, wall_clock=n.clock.wall, host="node1")
    if boot is not None:
        again.boot = boot
    again.open()
    again.tick()  # run_agent's first tick comes right after open
    n.fake, n.agent = fake, again
    return again


def test_restart_mid_job_resumes_counters_and_the_window_says_how_much_was_measured(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    e0 = n.fake.energy[U0]
    n.ticks(2, **{U0: BUSY})  # 10 s busy
    _restart(n, 13.0, HALF)  # down 13 s, then 15 s at half
    n.ticks(3, **{U0: HALF})
    m = n.coll.stop(job, st)
    (g,) = m.gpus
    assert m.reason is None and g["source"] == "nvml-gpm"
    assert (g["window_s"], g["measured_s"]) == (38.0, 25.0)
    (gap,) = g["window"]["gaps"]
    assert gap[1] - gap[0] == 13.0 and gap[2] == agent_resume.DIED
    # Means over the covered time only: 10 s busy + 15 s half.
    assert close(g["kernel_active"], (10 * 1.0 + 15 * 0.5) / 25, 1e-6)
    assert close(g["sm_active"], (10 * 0.8 + 15 * 0.2) / 25, 1e-6)
    # Energy from the counter, which ran on while the agent was down: the whole window.
    assert close(g["energy_j"], (n.fake.energy[U0] - e0) / 1000, 1e-3)
    assert close(g["energy_j"], (10 * 400 + 13 * 200 + 15 * 200), 1e-3)
    _as_record(job, m)


def test_a_clean_stop_and_start_is_a_gap_named_as_such(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    n.ticks(2, **{U0: BUSY})
    n.agent.close()  # systemctl restart: the final state says "stopped"
    _restart(n, 4.0, BUSY)
    n.ticks(2, **{U0: BUSY})
    (g,) = n.coll.stop(job, st).gpus
    assert g["window"]["gaps"][0][2] == agent_resume.STOPPED and g["measured_s"] == 20.0
    assert close(g["kernel_active"], 1.0)


def test_agent_down_at_the_prolog_measures_from_its_return(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    n.clock.advance(60)  # the agent died 60 s ago: its state is stale when the Prolog comes
    job = _job(n, [0])
    st = n.prolog(job)
    assert st["error"] is None and st["reading"]["down"] and "stale" in st["reading"]["down"]
    _restart(n, 5.0, BUSY)
    n.ticks(4, **{U0: BUSY})
    (g,) = n.coll.stop(job, st).gpus
    assert close(g["kernel_active"], 1.0) and g["measured_s"] == 20.0 and g["window_s"] == 25.0


@pytest.mark.parametrize(("case", "words"), [
    ("reboot", "node rebooted"),
    ("reset", "GPU reset or driver reloaded"),
])
def test_a_reboot_or_gpu_reset_breaks_continuity_and_the_card_says_which(tmp_path, case, words):
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    n.ticks(2, **{U0: BUSY})
    _restart(n, 5.0, BUSY, boot="another-boot" if case == "reboot" else None, energy_back=case == "reset")
    n.ticks(2, **{U0: BUSY})
    m = n.coll.stop(job, st)
    (g,) = m.gpus
    assert g["kernel_active"] is None and g["energy_j"] is None and g["sm_active"] is None
    assert words in g["missing"]["kernel_active"] and "continuity lost" in g["missing"]["kernel_active"]
    assert words in g["window"]["break"]
    os.unlink(os.path.join(n.cfg.paths.state_dir, "jobs", f"{job.job_id}.json"))  # as its Epilog does
    # A job that starts after the break is measured normally.
    job2 = _job(n, [0], job_id=1002)
    st2 = n.prolog(job2)
    n.ticks(2, **{U0: HALF})
    (g2,) = n.coll.stop(job2, st2).gpus
    assert close(g2["kernel_active"], 0.5) and g2["window"]["break"] is None


def test_gaps_outside_the_window_do_not_count():
    w = {"start": 100.0, "end": 160.0, "gaps": [[110.0, 120.0, "a"], [115.0, 125.0, "b"], [150.0, 160.0, "c"]]}
    assert measured_s(w) == 60.0 - 15.0 - 10.0
