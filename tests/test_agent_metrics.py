"""The node agent's live per-GPU gauges ([agent] metrics_port), scraped over real HTTP on loopback and
parsed with prometheus_client's own text parser. The GPUs are the GPU mock (tests/fake_gpus.py): no GPU
here; on a GPU the same collector reads the real sampler's readings (bench/gpu_validate.py covers those).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
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


# ------------------------------------------------------------------------------------------------------------
# A real agent process (its GPU the mock, tests/fake_gpus.py) and scrapes from an ordinary user, the way any
# user with a job on the node reaches its loopback.
USER = "gpuser"
SYS_PYTHON = "/usr/bin/python3"  # the venv's interpreter sits under /root, closed to gpuser
SCRAPE = ("import sys, urllib.request, urllib.error\n"
          "req = urllib.request.Request(sys.argv[1], headers={'Authorization': sys.argv[2]} if sys.argv[2] else {})\n"
          "try:\n    r = urllib.request.urlopen(req, timeout=10); print(r.status); print(r.read().decode())\n"
          "except urllib.error.HTTPError as e:\n    print(e.code); print(e.read().decode())\n")
AGENT = """
import sys, time
sys.path[:0] = [{root!r}, {tests!r}]
from fake_gpus import FakeClock, FakeSampler, hopper
from slurm_gpueff.config import load
from slurm_gpueff.node.run import run_agent
class Clock(FakeClock):
    @property
    def mono(self): return time.monotonic()
    @mono.setter
    def mono(self, v): pass
fake = FakeSampler(Clock(), [hopper({uuid!r}, 0)])
fake.set({uuid!r}, kernel_pct=90.0, power_mw=300_000.0, memory_used_bytes=2**30)
sys.exit(run_agent(load({config!r}), sampler=fake))
"""


def scrape_as(user: str | None, port: int, token: str = "") -> tuple[int, str]:
    argv = [SYS_PYTHON, "-c", SCRAPE, f"http://127.0.0.1:{port}/metrics", f"Bearer {token}" if token else ""]
    if user:
        argv = ["runuser", "-u", user, "--", *argv]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    status, _, body = p.stdout.partition("\n")
    return int(status), body


class RealAgent:
    """``gpueff agent``'s run_agent in a process of its own, with a config file under ``base``."""

    def __init__(self, base: str, root: str, **agent: object):
        self.base, self.root = base, root
        self.state = os.path.join(base, "state")
        self.port = free_port()
        self.config = os.path.join(base, "gpueff.toml")
        keys = "".join(f"{k} = {json.dumps(v)}\n" for k, v in agent.items())
        with open(self.config, "w") as fh:
            fh.write(f'[paths]\nstate_dir = "{self.state}"\nspool_dir = "{base}/spool"\n'
                     f'[collector]\nbackend = "nvml"\n[agent]\nmetrics_port = {self.port}\nlive_interval_s = 0\n'
                     f"{keys}")
        code = AGENT.format(root=root, tests=os.path.join(root, "tests"), uuid=H, config=self.config)
        self.proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)

    def wait(self, serving: bool = True) -> None:
        """Until it has ticked (its state file) and, with ``serving``, /metrics accepts connections."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.proc.communicate()[1]
            if os.path.exists(os.path.join(self.state, "agent", "state.json")):
                if not serving:
                    return
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", self.port)) == 0:
                        return
            time.sleep(0.05)
        raise AssertionError("the agent did not come up")

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, err
        return err


def job_file(state: str) -> None:
    """A running job's Prolog file (alice's, account physics) holding the GPU."""
    os.makedirs(os.path.join(state, "jobs"), exist_ok=True)
    with open(os.path.join(state, "jobs", "4242.json"), "w") as fh:
        json.dump({"start": {"uuids": [H]}, "start_time": time.time(), "gpus": [0], "run": 0,
                   "job": {"job_id": 4242, "user": "alice", "account": "physics", "run": 0}}, fh)


def job_labels(body: str) -> list[dict[str, str]]:
    return [s.labels for fam in text_string_to_metric_families(body) for s in fam.samples
            if s.name == "gpueff_job_info"]


@pytest.fixture
def shared_dir(repo_root):
    """A directory every user can enter (pytest's own are closed to them): the token's place."""
    d = tempfile.mkdtemp(prefix="gpueff-agent-metrics-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


needs_user = pytest.mark.skipif(os.geteuid() != 0 or not os.path.exists(SYS_PYTHON)
                                or subprocess.run(["id", USER], capture_output=True).returncode != 0,
                                reason="needs root, /usr/bin/python3 and the user gpuser")


@pytest.mark.process
@needs_user
def test_a_real_agent_answers_only_the_token_and_names_no_user(shared_dir, repo_root):
    token = os.path.join(shared_dir, "agent-token")
    with open(token, "w") as fh:
        fh.write("s3cret-scrape\n")
    os.chmod(token, 0o600)
    job_file(os.path.join(shared_dir, "state"))
    agent = RealAgent(shared_dir, repo_root, metrics_token_file=token)
    try:
        agent.wait()
        status, body = scrape_as(USER, agent.port)  # any user with a job here, without the token
        assert status == 401 and "gpueff_" not in body and "alice" not in body, body
        status, body = scrape_as(USER, agent.port, "a-guess")
        assert status == 401 and "alice" not in body
        p = subprocess.run(["runuser", "-u", USER, "--", "cat", token], capture_output=True, text=True)
        assert p.returncode != 0 and "s3cret" not in p.stdout  # the token is not theirs to read
        status, body = scrape_as(None, agent.port, "s3cret-scrape")  # Prometheus, with the token
        assert status == 200
        assert job_labels(body) == [{"job_id": "4242", "gpu": H, "minor": "0"}]
        assert "alice" not in body and "physics" not in body
    finally:
        agent.stop()
    # the site turns per-user series on: the same series name the job's user and account
    agent = RealAgent(shared_dir, repo_root, metrics_token_file=token, metrics_per_user=True)
    try:
        agent.wait()
        status, body = scrape_as(None, agent.port, "s3cret-scrape")
        assert status == 200
        assert job_labels(body) == [{"job_id": "4242", "user": "alice", "account": "physics", "gpu": H, "minor": "0"}]
    finally:
        agent.stop()


@pytest.mark.process
@needs_user
def test_a_token_file_every_user_reads_means_no_metrics_and_sampling_goes_on(shared_dir, repo_root):
    token = os.path.join(shared_dir, "agent-token")
    with open(token, "w") as fh:
        fh.write("s3cret-scrape\n")
    os.chmod(token, 0o644)
    agent = RealAgent(shared_dir, repo_root, metrics_token_file=token, metrics_per_user=True)
    try:
        agent.wait(serving=False)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", agent.port)) != 0  # nothing served, not even without a token
    finally:
        err = agent.stop()
    assert "cannot serve /metrics" in err and "readable by every user" in err and "sampling goes on" in err, err


def test_doctor_warns_on_per_user_series_without_a_token_and_fails_an_open_token_file(tmp_path):
    from slurm_gpueff.cli import doctor

    def lines(**agent: object) -> list[tuple[str, str]]:
        rep = doctor.Report()
        doctor.check_agent_metrics(rep, Config({"agent": {"metrics_port": 9818, **agent}}))
        return [(ln["status"], ln["detail"]) for ln in rep.lines]

    assert lines() == [] and lines(metrics_port=0, metrics_per_user=True) == []
    (status, detail), = lines(metrics_per_user=True)
    assert status == doctor.WARN and "agent.metrics_token_file" in detail
    token = tmp_path / "token"
    token.write_text("t\n")
    token.chmod(0o644)
    (status, detail), = lines(metrics_per_user=True, metrics_token_file=str(token))
    assert status == doctor.FAIL and "readable by every user" in detail
    token.chmod(0o600)
    (status, detail), = lines(metrics_per_user=True, metrics_token_file=str(token))
    assert status == doctor.PASS and "answers only the bearer token" in detail
