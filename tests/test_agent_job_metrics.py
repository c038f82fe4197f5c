"""The node agent's per-job series: one per (running job, whole GPU it holds), labelled by job id, GPU UUID and
minor (and user and account only with ``[agent] metrics_per_user``), gone once the Epilog removed the job's
Prolog file. Real agent on the GPU mock
(tests/fake_gpus.py); the job files are written as the Prolog saves them.
"""

from __future__ import annotations

import json
import os

import pytest
from fake_gpus import FakeClock, FakeSampler, GiB, ampere, hopper, make_config

from slurm_gpueff.node.agent import Agent

H, A = "GPU-hhhhhhhh-0000-0000-0000-000000000000", "GPU-aaaaaaaa-1111-1111-1111-111111111111"
MIG = "MIG-11111111-2222-3333-4444-555555555555"
JOB_SERIES = ("gpueff_job_info", "gpueff_job_gpu_kernel_active_ratio", "gpueff_job_gpu_sm_active_ratio",
              "gpueff_job_gpu_tensor_active_ratio", "gpueff_job_gpu_dram_active_ratio",
              "gpueff_job_gpu_memory_used_bytes", "gpueff_job_gpu_power_watts")


def write_job(state_dir: str, name: str, uuids: list[str], job: dict | None = None) -> str:
    """A Prolog job file: the collector's start state names the job's GPUs; ``job`` is who runs it."""
    saved: dict = {"start": {"uuids": uuids}, "start_time": 1.75e9, "gpus": [0], "run": 0}
    if job is not None:
        saved["job"] = job
    os.makedirs(os.path.join(state_dir, "jobs"), exist_ok=True)
    path = os.path.join(state_dir, "jobs", f"{name}.json")
    with open(path, "w") as fh:
        json.dump(saved, fh)
    return path


def series(agent: Agent) -> dict[str, dict[tuple, float]]:
    """Per job series: (job_id, user, account, gpu, minor) -> value; user and account read None where the
    series carry no such label."""
    out: dict[str, dict[tuple, float]] = {name: {} for name in JOB_SERIES}
    for fam in agent.collect():
        for s in fam.samples:
            if s.name in out:
                lab = s.labels
                out[s.name][(lab["job_id"], lab.get("user"), lab.get("account"), lab["gpu"], lab["minor"])] = s.value
    return out


def make_agent(tmp_path, **agent_keys):
    clock = FakeClock()
    fake = FakeSampler(clock, [hopper(H, 0), ampere(A, 1)])
    a = Agent(make_config(tmp_path, **agent_keys), fake, wall_clock=clock.wall)
    a.open()
    fake.set(H, kernel_pct=100.0, power_mw=300_000.0, memory_used_bytes=20 * GiB,
             gpm={"sm_active": 55.0, "tensor_active": 0.0, "dram_active": 30.0})
    fake.set(A, kernel_pct=10.0, power_mw=90_000.0, memory_used_bytes=2 * GiB)
    a.tick()
    clock.advance(5.0)
    return a


@pytest.fixture
def agent(tmp_path):
    """An agent whose site turned per-user series on: user and account labels."""
    a = make_agent(tmp_path, metrics_per_user=True)
    yield a
    a.close()


def test_without_per_user_series_no_user_or_account_label(tmp_path):
    """The default: the node's users share its loopback, so who runs which job is not in the series."""
    a = make_agent(tmp_path)
    try:
        write_job(a.state_dir, "101", [H], {"job_id": 101, "user": "alice", "uid": 1001, "account": "physics"})
        a.tick()
        m = series(a)
        assert m["gpueff_job_info"] == {("101", None, None, H, "0"): 1.0}
        assert m["gpueff_job_gpu_kernel_active_ratio"] == {("101", None, None, H, "0"): 1.0}
        for fam in a.collect():
            for s in fam.samples:
                assert not {"user", "account"} & set(s.labels), s
                assert "alice" not in s.labels.values() and "physics" not in s.labels.values()
    finally:
        a.close()


def test_running_jobs_have_series_of_their_gpus(agent):
    sd = agent.state_dir
    write_job(sd, "101", [H], {"job_id": 101, "user": "alice", "uid": 1001, "account": "physics",
                               "partition": "gpu", "run": 0})
    write_job(sd, "102", [A, MIG])  # a Prolog that saved no "job": the file name's id, no user or account
    agent.tick()
    m = series(agent)
    j1, j2 = ("101", "alice", "physics", H, "0"), ("102", "", "", A, "1")
    assert m["gpueff_job_info"] == {j1: 1.0, j2: 1.0}  # the MIG device of job 102 has no series
    assert m["gpueff_job_gpu_kernel_active_ratio"] == {j1: 1.0, j2: 0.1}
    assert m["gpueff_job_gpu_sm_active_ratio"] == {j1: pytest.approx(0.55)}  # the A100 has no GPM: no 0
    assert m["gpueff_job_gpu_tensor_active_ratio"] == {j1: 0.0}  # a measured 0 is a 0
    assert m["gpueff_job_gpu_dram_active_ratio"] == {j1: pytest.approx(0.30)}
    assert m["gpueff_job_gpu_memory_used_bytes"] == {j1: 20 * GiB, j2: 2 * GiB}
    assert m["gpueff_job_gpu_power_watts"] == {j1: 300.0, j2: 90.0}


def test_a_finished_job_disappears_and_labels_follow_the_file(agent):
    sd = agent.state_dir
    first = write_job(sd, "7", [H], {"job_id": 7, "user": None, "uid": None, "account": None,
                                     "partition": None, "run": 0})
    write_job(sd, "8", [A], {"job_id": 8, "user": "bob", "account": "chem", "run": 1})
    agent.tick()
    assert set(series(agent)["gpueff_job_info"]) == {("7", "", "", H, "0"), ("8", "bob", "chem", A, "1")}
    os.unlink(first)  # the Epilog
    agent.tick()
    m = series(agent)
    assert all(k[0] == "8" for fam in m.values() for k in fam)
    assert m["gpueff_job_info"] == {("8", "bob", "chem", A, "1"): 1.0}


def test_an_unreadable_or_foreign_job_file_has_no_series(agent):
    sd = agent.state_dir
    os.makedirs(os.path.join(sd, "jobs"), exist_ok=True)
    with open(os.path.join(sd, "jobs", "9.json"), "w") as fh:
        fh.write("{not json")
    write_job(sd, "10", ["GPU-not-on-this-node"], {"job_id": 10, "user": "carol", "account": "bio"})
    agent.tick()
    assert all(not fam for fam in series(agent).values())


def test_no_job_no_job_series_and_no_job_labels_elsewhere(agent):
    fams = list(agent.collect())
    assert {f.name for f in fams} >= set(JOB_SERIES)
    for f in fams:
        assert not f.samples or not f.name.startswith("gpueff_job_")
        if not f.name.startswith("gpueff_job_"):
            assert all("job_id" not in s.labels for s in f.samples)
