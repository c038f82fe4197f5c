"""Readings on request: the hooks' exact window ends, against the real agent process.

The real ``run_agent`` loop runs in a subprocess with its default 5 s interval; the GPU is a fake sampler
(tests/fake_gpus.py, the only mock). The hooks' client (node/tickwire.py) and the real collector talk
to it over its real Unix socket.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from fake_gpus import make_config, make_dev_dir

from slurm_gpueff import statedir
from slurm_gpueff.collectors.base import JobContext
from slurm_gpueff.collectors.nvml import NvmlCollector
from slurm_gpueff.node import tickwire

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


@pytest.fixture
def agent(tmp_path, repo_root):
    """A running agent (interval 5 s) on a fake Hopper GPU; yields its config."""
    cfg = make_config(tmp_path)
    code = textwrap.dedent(f"""
        import sys, time
        sys.path[:0] = [{repo_root!r}, {os.path.join(repo_root, 'tests')!r}]
        from fake_gpus import FakeClock, FakeSampler, hopper, make_config
        from slurm_gpueff.node.run import run_agent
        class Clock(FakeClock):
            @property
            def mono(self): return time.monotonic()
            @mono.setter
            def mono(self, v): pass
        sys.exit(run_agent(make_config({str(tmp_path)!r}), sampler=FakeSampler(Clock(), [hopper({U0!r})])))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    sock = statedir.reading_socket(cfg.paths.state_dir)
    deadline = time.time() + 20
    while not (os.path.exists(sock) and os.path.exists(statedir.agent_state(cfg.paths.state_dir))):
        if time.time() > deadline or proc.poll() is not None:
            proc.kill()
            pytest.fail(f"agent did not start: {proc.communicate()[1]}")
        time.sleep(0.05)
    yield cfg
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err


def _state(cfg):
    with open(statedir.agent_state(cfg.paths.state_dir)) as fh:
        return json.load(fh)


@pytest.mark.process
def test_a_requested_reading_is_taken_after_the_request_and_published(agent):
    time.sleep(1.2)  # past GPM's minimum spacing since the agent's first tick
    before = _state(agent)
    asked = time.time()
    answer, why = tickwire.request_reading(agent.paths.state_dir, 1.5)
    took = time.time() - asked
    assert why is None and answer is not None
    assert took < 1.5 and answer["updated"] >= asked  # not the last scheduled tick: one taken now
    st = _state(agent)
    assert st["updated"] == answer["updated"] and st["ticks"] == before["ticks"] + 1
    assert abs(st["gpus"][U0]["energy_read_at"] - st["updated"]) < 0.5  # the energy counter read then, too


@pytest.mark.process
def test_readings_keep_gpm_spacing_and_concurrent_requests_share_one(agent):
    time.sleep(1.2)
    first, _ = tickwire.request_reading(agent.paths.state_dir, 1.5)
    answers: list[tuple[dict | None, str | None]] = []
    threads = [threading.Thread(target=lambda: answers.append(tickwire.request_reading(agent.paths.state_dir, 1.5)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert first is not None and all(why is None for _, why in answers)
    later = {a["updated"] for a, _ in answers if a}
    assert len(later) <= 2  # four Epilogs at once: one reading (two if a request came during it)
    assert min(later) - first["updated"] >= 0.95  # GPM needs about 1 s between samples


@pytest.mark.process
def test_the_collector_marks_an_exact_start(agent, tmp_path):
    time.sleep(1.2)
    coll = NvmlCollector(agent, dev_dir=make_dev_dir(tmp_path, [0]))
    job = JobContext(5, "node1", "c", [0], start_time=time.time())
    st = coll.start(job)
    assert st["error"] is None and st["reading"]["exact"] is True and st["reading"]["why"] is None
    assert st["gpus"]["0"]["snapshot"]["series"]
    time.sleep(1.1)
    m = coll.stop(job, json.loads(json.dumps(st)))
    (g,) = m.gpus
    w = g["window"]
    assert w["start_exact"] and w["end_exact"] and abs(w["start_offset_s"]) < 1.6 and g["measured_s"] == g["window_s"]


def test_without_an_agent_the_hook_falls_back_and_says_why(tmp_path):
    cfg = make_config(tmp_path)
    answer, why = tickwire.request_reading(cfg.paths.state_dir, 1.5)
    assert answer is None and "no socket" in why
    answer, why = tickwire.request_reading(cfg.paths.state_dir, 0)
    assert answer is None and "tick_wait_s = 0" in why


@pytest.mark.process
def test_back_to_back_jobs_share_no_interval(agent, tmp_path):
    """Job A's Epilog, then at once job B's Prolog on the same GPU: B's window starts at or after A's end."""
    time.sleep(1.2)
    coll = NvmlCollector(agent, dev_dir=make_dev_dir(tmp_path, [0]))
    a = JobContext(11, "node1", "c", [0], start_time=time.time())
    sa = json.loads(json.dumps(coll.start(a)))
    time.sleep(1.1)
    (ga,) = coll.stop(a, sa).gpus
    b = JobContext(12, "node1", "c", [0], start_time=time.time())
    sb = json.loads(json.dumps(coll.start(b)))
    time.sleep(1.1)
    (gb,) = coll.stop(b, sb).gpus
    assert ga["window"]["end_exact"] and gb["window"]["start_exact"]
    assert gb["window"]["start"] >= ga["window"]["end"] and gb["window"]["end"] > gb["window"]["start"]


@pytest.mark.process
def test_doctor_checks_that_the_agent_answers(agent, tmp_path):
    from slurm_gpueff.cli import doctor

    time.sleep(1.2)
    rep = doctor.Report()
    doctor.check_agent(rep, agent)
    lines = {ln["check"]: ln for ln in rep.lines}
    assert lines["agent"]["status"] == doctor.PASS
    readings = lines["agent readings"]
    assert readings["status"] == doctor.PASS and "a reading on request in" in readings["detail"]
    os.unlink(statedir.reading_socket(agent.paths.state_dir))  # an agent that takes no requests
    rep = doctor.Report()
    doctor.check_agent(rep, agent)
    line = {ln["check"]: ln for ln in rep.lines}["agent readings"]
    assert line["status"] == doctor.WARN and "fall back to the agent's last reading" in line["detail"]
