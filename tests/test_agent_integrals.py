"""The nvml node agent's integrals, state file, job peaks and timeline, on CPU.

The GPU is mocked (tests/fake_gpus.py: a scripted sampler fed into the real agent); the agent loop,
the arithmetic, the atomic state file and the timeline files are the real code.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from fake_gpus import FakeClock, FakeSampler, GiB, ampere, close, hopper, make_config

from slurm_gpueff import statedir
from slurm_gpueff.errors import CollectorError
from slurm_gpueff.node import integrals
from slurm_gpueff.node.agent import Agent
from slurm_gpueff.node.agent_files import line_time
from slurm_gpueff.node.nvml_sampler import NO_GPM_REASON, NvmlSampler
from slurm_gpueff.node.run import run_agent

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
U1 = "GPU-bbbbbbbb-1111-1111-1111-111111111111"


def _agent(tmp_path, gpus, **agent_cfg):
    clock = FakeClock()
    sampler = FakeSampler(clock, gpus)
    cfg = make_config(tmp_path, **agent_cfg)
    ag = Agent(cfg, sampler, wall_clock=clock.wall, host="node1")
    ag.open()
    return ag, sampler, clock


def _read(path):
    with open(path) as fh:
        return json.load(fh)


def _state(cfg_or_agent):
    with open(statedir.agent_state(cfg_or_agent.state_dir)) as fh:
        return json.load(fh)


def test_uneven_intervals_give_exact_time_weighted_means(tmp_path):
    ag, fake, clock = _agent(tmp_path, [hopper(U0)])
    # (dt before the tick, kernel %, SM %) -- first tick only sets the baseline.
    script = [(0.0, 50, 10), (1.0, 50, 10), (2.5, 100, 40), (0.5, 0, 0), (5.0, 20, 5), (1.5, 80, 60)]
    for dt, k, s in script:
        clock.advance(dt)
        fake.set(U0, kernel_pct=k, gpm={"sm_active": s, "tensor_active": 0.0})
        ag.tick()
    held = script[1:]
    exp_k = sum(dt * k / 100 for dt, k, _ in held) / sum(dt for dt, _, _ in held)
    exp_s = sum(dt * s / 100 for dt, _, s in held) / sum(dt for dt, _, _ in held)
    st = _state(ag)["gpus"][U0]
    assert close(st["sum"]["kernel_active"] / st["covered_s"]["kernel_active"], exp_k, 1e-6)
    assert close(st["sum"]["sm_active"] / st["covered_s"]["sm_active"], exp_s, 1e-6)
    assert st["count"]["kernel_active"] == 5 and st["ticks"] == 5
    assert close(st["covered_s"]["kernel_active"], 10.5, 1e-6)
    # A window between two snapshots (after tick 3 and after tick 6) averages only that window.
    ag2, fake2, clock2 = _agent(tmp_path / "b", [hopper(U0)])
    snaps = []
    for i, (dt, k, s) in enumerate(script):
        clock2.advance(dt)
        fake2.set(U0, kernel_pct=k, gpm={"sm_active": s})
        ag2.tick()
        if i in (2, 5):
            snaps.append(_state(ag2)["gpus"][U0])
    win = script[3:]
    mean, cov, n = integrals.window(snaps[0], snaps[1], "kernel_active")
    assert close(mean, sum(dt * k / 100 for dt, k, _ in win) / sum(dt for dt, _, _ in win), 1e-6)
    assert close(cov, 7.0, 1e-6) and n == 3


def test_nan_none_and_errors_are_missing_not_zero(tmp_path):
    ag, fake, clock = _agent(tmp_path, [hopper(U0)])
    ag.tick()
    clock.advance(2.0)
    fake.set(U0, kernel_pct=60, gpm={"sm_active": 30, "dram_active": float("nan")})
    ag.tick()
    clock.advance(3.0)
    fake.set(U0, kernel_pct=None, power_mw=None, gpm={"sm_active": 50, "dram_active": 20},
             errors={"power": "NVML_ERROR_UNKNOWN"})
    ag.tick()
    st = _state(ag)["gpus"][U0]
    # kernel: only the 2 s reading counts (the None one neither adds value nor time).
    assert st["count"]["kernel_active"] == 1 and close(st["covered_s"]["kernel_active"], 2.0)
    assert close(st["sum"]["kernel_active"] / st["covered_s"]["kernel_active"], 0.6)
    # DRAM: NaN is missing, so its mean is 20 % over the 3 s that had a value, not diluted to 12 %.
    assert close(st["covered_s"]["dram_active"], 3.0) and close(st["sum"]["dram_active"] / 3.0, 0.2)
    # A metric never reported has no coverage at all (the collector turns that into None).
    assert st["count"]["fp64_active"] == 0 and st["covered_s"]["fp64_active"] == 0
    assert st["errors"] == {"power": "NVML_ERROR_UNKNOWN"}
    assert integrals.window({"sum": st["sum"], "covered_s": {}, "count": {}}, st, "fp64_active")[0] is None


def test_state_file_contents_and_pre_hopper(tmp_path):
    ag, fake, clock = _agent(tmp_path, [hopper(U0, 0, minor=1), ampere(U1, 1, minor=0)])
    for _ in range(3):
        fake.set(U1, kernel_pct=40)
        ag.tick()
        clock.advance(5)
    st = _state(ag)
    assert st["version"] == 2 and st["pid"] == os.getpid() and st["host"] == "node1"
    assert st["interval_s"] == 5.0 and st["stopped"] is False and st["updated"] == clock.wall() - 5
    assert set(st["gpus"]) == {U0, U1}
    h, a = st["gpus"][U0], st["gpus"][U1]
    assert (h["minor"], h["index"], h["gpm_supported"], h["gpm_reason"]) == (1, 0, True, None)
    assert h["memory_total_bytes"] == 80 * GiB and h["model"].startswith("NVIDIA H100")
    assert (a["minor"], a["gpm_supported"], a["gpm_reason"]) == (0, False, NO_GPM_REASON)
    assert a["count"]["sm_active"] == 0 and a["count"]["kernel_active"] == 2
    assert a["memory_used_bytes"] == 1 * GiB
    assert oct(os.stat(statedir.agent_state(ag.state_dir)).st_mode & 0o777) == "0o644"


def test_energy_counter_read_every_n_seconds_and_extended_by_power(tmp_path):
    clock = FakeClock()
    fake = FakeSampler(clock, [hopper(U0)])
    ag = Agent(make_config(tmp_path), fake, wall_clock=clock.wall, energy_interval_s=30.0)
    ag.open()
    for i in range(13):  # 60 s at 5 s ticks
        fake.set(U0, power_mw=100_000.0 + 1000 * i)
        ag.tick()
        clock.advance(5)
    assert fake.energy_reads == 3  # t = 0, 30, 60: the expensive call is rare
    st = _state(ag)["gpus"][U0]
    # The estimate equals the true counter (the fake's power is constant over each interval).
    assert close(st["energy_est_mj"], fake.energy[U0], 1e-9)
    assert st["energy_mj"] == round(fake.energy[U0])


def test_peak_memory_per_job_is_not_contaminated_by_earlier_use(tmp_path):
    ag, fake, clock = _agent(tmp_path, [hopper(U0), hopper(U1, 1)])
    jobs = os.path.join(ag.state_dir, "jobs")
    os.makedirs(jobs)
    fake.set(U0, memory_used_bytes=70 * GiB)  # an earlier job's memory, before this job's Prolog
    ag.tick()
    clock.advance(5)
    fake.set(U0, memory_used_bytes=2 * GiB)
    ag.tick()
    with open(os.path.join(jobs, "4242.json"), "w") as fh:
        json.dump({"job_id": 4242, "start": {"uuids": [U0]}}, fh)
    for mem in (3, 9, 5):
        clock.advance(5)
        fake.set(U0, memory_used_bytes=mem * GiB)
        fake.set(U1, memory_used_bytes=33 * GiB)  # another job's GPU: not ours
        ag.tick()
    st = _state(ag)
    assert st["jobs"] == {"4242": {U0: 9 * GiB}}
    # A file with junk is tolerated (no UUIDs yet); a removed job file drops the job.
    with open(os.path.join(jobs, "77.json"), "w") as fh:
        fh.write("{not json")
    os.unlink(os.path.join(jobs, "4242.json"))
    clock.advance(5)
    ag.tick()
    assert _state(ag)["jobs"] == {"77": {}}


def test_timeline_lines_difference_into_per_minute_means(tmp_path):
    ag, fake, clock = _agent(tmp_path, [hopper(U0)], interval_s=5.0, timeline_interval_s=60.0)
    kernel_by_minute = [10, 90, 40]
    ag.tick()
    for minute, k in enumerate(kernel_by_minute):
        for _ in range(12):
            clock.advance(5)
            fake.set(U0, kernel_pct=k, gpm={"sm_active": k / 2, "tensor_active": 1.0})
            ag.tick()
        assert minute >= 0
    with open(statedir.timeline(ag.state_dir, U0)) as fh:
        lines = fh.readlines()
    assert len(lines) == 4  # t = 0, 60, 120, 180
    snaps = [(line_time(ln), json.loads(ln)) for ln in lines]
    pts = integrals.timeline_points(snaps, t0=snaps[0][0])
    assert [p[0] for p in pts] == [30.0, 90.0, 150.0]
    assert [p[1] for p in pts] == [0.1, 0.9, 0.4]
    assert [p[2] for p in pts] == [0.05, 0.45, 0.2]
    assert all(p[3] == 0.01 for p in pts)
    # Merging into at most 2 points keeps exact means (sum of deltas / sum of coverage).
    merged = integrals.timeline_points(snaps, t0=snaps[0][0], max_points=2)
    assert len(merged) == 2 and merged[0][1] == 0.5 and merged[1][1] == 0.4


def test_old_timeline_lines_are_pruned(tmp_path):
    ag, fake, clock = _agent(tmp_path, [hopper(U0)], timeline_interval_s=60.0, timeline_keep_h=1.0)
    path = statedir.timeline(ag.state_dir, U0)
    old = clock.wall() - 2 * 3600
    with open(path, "w") as fh:
        fh.write(json.dumps({"t": old, "instance": "x", "sum": {}, "covered_s": {}, "count": {}}) + "\n")
    ag.tick()  # the first tick appends a line and prunes
    with open(path) as fh:
        ts = [line_time(ln) for ln in fh]
    assert ts == [pytest.approx(clock.wall(), abs=1e-3)]


def test_gap_longer_than_three_intervals_is_not_filled_in(tmp_path):
    ag, fake, clock = _agent(tmp_path, [hopper(U0)])
    fake.set(U0, kernel_pct=100, gpm={"sm_active": 50})
    ag.tick()
    clock.advance(5)
    ag.tick()
    clock.advance(600)  # the agent was stopped by the kernel for 10 minutes
    ag.tick()
    st = _state(ag)["gpus"][U0]
    assert close(st["covered_s"]["kernel_active"], 5.0)  # the gap is not credited
    assert close(st["covered_s"]["sm_active"], 605.0)  # GPM's value is an exact mean over the gap


def test_run_agent_once_with_fake_sampler(tmp_path):
    clock = FakeClock()
    fake = FakeSampler(clock, [hopper(U0)])
    cfg = make_config(tmp_path)
    assert run_agent(cfg, once=True, sampler=fake) == 0
    st = _state(cfg.paths)
    assert fake.calls == 1 and fake.closed
    assert st["stopped"] is True and st["ticks"] == 1 and list(st["gpus"]) == [U0]


def test_run_agent_reports_sampler_failure(tmp_path, caplog):
    fake = FakeSampler(FakeClock(), [], fail_open="NVML library libnvidia-ml.so.1 not found")
    with caplog.at_level(logging.ERROR):
        assert run_agent(make_config(tmp_path), once=True, sampler=fake) == 1
    assert "libnvidia-ml.so.1 not found" in caplog.text


def _nvml_answers() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_nvml_answers(), reason="NVML works here; this checks the no-driver error")
def test_real_nvml_without_driver_fails_with_a_clear_message():
    with pytest.raises(CollectorError) as err:
        NvmlSampler().open()
    msg = str(err.value)
    assert "NVML" in msg and ("libnvidia-ml.so.1 not found" in msg or "driver" in msg)
    assert "NVMLError_" in msg


@pytest.mark.process
def test_sigterm_finishes_the_tick_and_exits_zero(tmp_path, repo_root):
    """The real run_agent loop in a subprocess (fake GPU), stopped with SIGTERM."""
    cfg_path = tmp_path / "gpueff.toml"
    state_dir = tmp_path / "state"
    cfg_path.write_text(f'[paths]\nstate_dir = "{state_dir}"\n[agent]\ninterval_s = 1.0\n')
    code = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{repo_root!r}, {os.path.join(repo_root, 'tests')!r}]
        from fake_gpus import FakeClock, FakeSampler, hopper
        from slurm_gpueff.config import load
        from slurm_gpueff.node.run import run_agent
        class Clock(FakeClock):
            @property
            def mono(self): return time.monotonic()
            @mono.setter
            def mono(self, v): pass
        sys.exit(run_agent(load({str(cfg_path)!r}), sampler=FakeSampler(Clock(), [hopper({U0!r})])))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    path = statedir.agent_state(str(state_dir))
    deadline = time.time() + 20
    while time.time() < deadline:
        if os.path.exists(path) and _read(path)["ticks"] >= 2:
            break
        time.sleep(0.1)
    else:
        proc.kill()
        pytest.fail(f"agent wrote no state: {proc.communicate()[1]}")
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    st = _read(path)
    assert st["stopped"] is True and st["ticks"] >= 2
    gpu = st["gpus"][U0]
    assert gpu["count"]["kernel_active"] >= 1 and math.isclose(gpu["covered_s"]["kernel_active"],
                                                                  gpu["ticks"] * 1.0, rel_tol=0.5)


def test_gpm_samples_between_readings_make_one_second_intervals(tmp_path):
    """Between its full readings the agent takes GPM samples (GPM_STEP_S), so an interval that spans a job's
    idle/busy edge is short: the counters add each 1 s interval's GPM mean weighted by wall time."""
    ag, fake, clock = _agent(tmp_path, [hopper(U0)])
    ag.tick()  # the window's first reading
    before = copy.deepcopy(ag.gpus[U0].counters)
    for sm in (0, 0, 90, 90):  # idle 2 s, then busy: four GPM samples 1 s apart
        clock.advance(1.0)
        fake.set(U0, gpm={"sm_active": sm})
        ag.gpm_tick()
    clock.advance(1.0)
    fake.set(U0, gpm={"sm_active": 90})
    ag.tick()  # the next full reading closes the last 1 s interval
    after = ag.gpus[U0].counters
    mean, covered, n = integrals.window(before, after, "sm_active")
    assert (covered, n) == (5.0, 5) and close(mean, (0 + 0 + 0.9 * 3) / 5, 1e-9)
    assert fake.gpm_calls == 4 and ag.ticks == 2
