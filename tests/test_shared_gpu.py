"""Jobs sharing one GPU: the real agent splits the device's readings among them by their processes.

The GPU is the only mock (tests/fake_gpus.py: scripted device readings and per-process utilization samples,
as NVML gives them); /proc is a stand-in tree holding each process's real-format ``cgroup``, ``stat`` and
``environ`` files. The agent, its attribution, the state file and the hook-side collector are the real code.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from fake_gpus import FakeClock, FakeSampler, GiB, close, hopper, make_config, make_dev_dir
from record_rows import rows_of_models

from slurm_gpueff import record
from slurm_gpueff.collectors.base import JobContext
from slurm_gpueff.collectors.nvml import NvmlCollector
from slurm_gpueff.node.agent import Agent
from slurm_gpueff.node.proc_jobs import ProcessJobs, job_of_cgroup, job_of_environ

U0 = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
V2 = "0::/system.slice/slurmstepd.scope/job_{}/step_0/user/task_0\n"
V1 = ("12:memory:/slurm/uid_1000/job_{}/step_batch/task_0\n11:devices:/slurm/uid_1000/job_{}/step_batch\n"
      "1:name=systemd:/system.slice/slurmd.service\n")
STRAY = "0::/user.slice/user-1002.slice/session-4.scope\n"
BUSY = {"kernel_pct": None, "power_mw": 400_000.0,
        "gpm": {"kernel_active": 100, "sm_active": 80, "tensor_active": 40, "dram_active": 20}}


def fake_proc(root, pid, cgroup, env=b"", uid=None, comm="python3"):
    d = os.path.join(root, str(pid))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "comm"), "w") as fh:
        fh.write(comm + "\n")
    with open(os.path.join(d, "cgroup"), "w") as fh:
        fh.write(cgroup)
    with open(os.path.join(d, "stat"), "w") as fh:
        fh.write(f"{pid} (python3) S 1 {pid} {pid} 0 -1 4194560 " + " ".join(["0"] * 12) + f" {pid * 10} 0 0\n")
    with open(os.path.join(d, "environ"), "wb") as fh:
        fh.write(env)
    if uid is not None:
        os.chown(d, uid, -1)


class SharedNode:
    def __init__(self, tmp_path):
        self.clock = FakeClock()
        self.fake = FakeSampler(self.clock, [hopper(U0, 0, 0)])
        self.cfg = make_config(tmp_path)
        self.proc = str(tmp_path / "proc")
        self.agent = Agent(self.cfg, self.fake, wall_clock=self.clock.wall, host="node1",
                           proc_jobs=ProcessJobs(self.proc, uid_of={"alice": os.getuid()}.get))
        self.agent.open()
        self.coll = NvmlCollector(self.cfg, dev_dir=make_dev_dir(tmp_path, [0]), now=self.clock.wall)

    def ticks(self, n, dt=5.0, **values):
        for _ in range(n):
            self.clock.advance(dt)
            self.fake.set(U0, **values)
            self.agent.tick()

    def prolog(self, job_id, user="alice"):
        job = JobContext(job_id, "node1", "c", [0], start_time=self.clock.wall())
        self.agent.tick(requested=True)  # the hook asks for a reading
        st = self.coll.start(job)
        with open(os.path.join(self.cfg.paths.state_dir, "jobs", f"{job_id}.json"), "w") as fh:
            json.dump({"job_id": job_id, "job": {"job_id": job_id, "user": user}, "start": st}, fh)
        return job, json.loads(json.dumps(st))

    def two_jobs(self):
        """Jobs 1001 (pid 501) and 1002 (pid 502) in their Slurm cgroups, both Prolog'd on GPU 0."""
        fake_proc(self.proc, 501, V2.format(1001))
        fake_proc(self.proc, 502, V2.format(1002))
        os.makedirs(os.path.join(self.cfg.paths.state_dir, "jobs"), exist_ok=True)
        return self.prolog(1001), self.prolog(1002)

    def epilog(self, job, st):
        self.agent.tick(requested=True)
        m = self.coll.stop(job, st)
        os.unlink(os.path.join(self.cfg.paths.state_dir, "jobs", f"{job.job_id}.json"))
        rec = {"schema": 1, "cluster": "c", "node": "node1", "job_id": job.job_id, "start_time": 1.0e9,
               "end_time": 1.0e9 + 60, "backend": m.backend, "gpus": m.gpus}
        (g,) = record.validate(rec)["gpus"]
        return g


def test_slurm_cgroup_layouts_name_the_job():
    assert job_of_cgroup(V2.format(4242)) == "4242"
    assert job_of_cgroup(V1.format(77, 77)) == "77"
    assert job_of_cgroup("0::/system.slice/node7_slurmstepd.scope/job_9/step_extern/slurm_task\n") == "9"
    assert job_of_cgroup("3:cpuset:/slurm_node7/uid_0/job_15/step_0\n") == "15"
    assert job_of_cgroup(STRAY) is None
    assert job_of_cgroup("0::/user.slice/job_12/x\n") is None  # a job_N not below Slurm's directory
    assert job_of_cgroup("0::/slurm/job_\u0663/x\n") is None  # ASCII digits only, as Slurm writes them
    assert job_of_environ(b"PATH=/bin\0SLURM_JOB_ID=31\0HOME=/x\0") == "31"
    assert job_of_environ(b"XSLURM_JOB_ID=31\0") is None


def test_environment_maps_only_the_jobs_own_users_processes(tmp_path):
    proc = str(tmp_path)
    fake_proc(proc, 10, STRAY, b"SLURM_JOB_ID=5\0")
    pj = ProcessJobs(proc, uid_of={"alice": os.getuid(), "bob": os.getuid() + 1}.get)
    assert pj.owner(10, {"5": "alice"}).job == "5"
    bob = ProcessJobs(proc, uid_of={"bob": os.getuid() + 1}.get).owner(10, {"5": "bob"})
    assert bob.job is None and "not bob's" in bob.how
    assert pj.owner(11, {"5": "alice"}).job is None  # gone


def test_two_jobs_on_one_gpu_get_their_own_parts(tmp_path):
    n = SharedNode(tmp_path)
    fake_proc(n.proc, 501, V2.format(1001))
    fake_proc(n.proc, 502, V1.format(1002, 1002))
    fake_proc(n.proc, 503, STRAY)  # another user's process outside any job
    os.makedirs(os.path.join(n.cfg.paths.state_dir, "jobs"))
    n.ticks(2, **BUSY)
    a, sta = n.prolog(1001)
    n.fake.set_procs(U0, sm={501: 90}, memory={501: 10 * GiB})
    n.ticks(4, **BUSY)  # A alone for 20 s: everything is A's, no process looked at
    assert n.fake.proc_calls == []
    b, stb = n.prolog(1002)
    n.fake.set_procs(U0, sm={501: 60, 502: 30, 503: 10}, memory={501: 10 * GiB, 502: 3 * GiB, 503: GiB})
    e0 = n.fake.energy[U0]
    n.ticks(6, **BUSY)  # 30 s shared
    e_shared = n.fake.energy[U0] - e0
    gb = n.epilog(b, stb)
    n.fake.set_procs(U0, sm={501: 90}, memory={501: 10 * GiB})
    n.ticks(2, **BUSY)
    ga = n.epilog(a, sta)

    # B: 30 s shared, its processes 30 of 100 sample points; unattributed 10.
    assert close(gb["kernel_active"], 0.3, 1e-6) and close(gb["sm_active"], 0.8 * 0.3, 1e-6)
    assert close(gb["energy_j"], e_shared / 1000 * 0.3, 1e-3)
    assert gb["memory_used_peak_bytes"] == 3 * GiB
    sh = gb["shared"]
    assert sh["with"] == ["1001"] and close(sh["share"], 0.5, 1e-6) and close(sh["unattributed"], 0.1, 1e-6)
    assert "Slurm cgroup" in sh["method"] and gb["timeline"] == []
    # A: 20 s alone (all of it), 30 s at 60 %, then 10 s alone again: its own part of a busy GPU.
    assert close(ga["kernel_active"], (20 + 30 * 0.6 + 10) / 60, 1e-6)
    assert ga["memory_used_peak_bytes"] == 10 * GiB
    assert ga["shared"]["with"] == ["1002"] and close(ga["shared"]["share"], (20 + 15 + 10) / 60, 1e-6)
    # The parts add up to the device: A's + B's + unattributed over the shared 30 s = 100 % kernel time.
    assert close(0.6 + gb["kernel_active"] + 0.1, 1.0, 1e-6)


def test_a_gpu_held_alone_is_recorded_as_before(tmp_path):
    n = SharedNode(tmp_path)
    os.makedirs(os.path.join(n.cfg.paths.state_dir, "jobs"))
    n.ticks(2, **BUSY)
    a, sta = n.prolog(1001)
    n.ticks(4, **BUSY)
    g = n.epilog(a, sta)
    assert "shared" not in g and close(g["kernel_active"], 1.0) and close(g["sm_active"], 0.8)
    assert n.fake.proc_calls == [] and g["timeline"]


def test_an_unreadable_process_list_leaves_the_activity_unattributed(tmp_path):
    n = SharedNode(tmp_path)
    os.makedirs(os.path.join(n.cfg.paths.state_dir, "jobs"))
    a, sta = n.prolog(1001)
    b, stb = n.prolog(1002)
    n.fake.set_procs(U0, sm={}, memory={})  # NVML reported no process: nothing can be given to a job
    n.ticks(3, **BUSY)
    g = n.epilog(b, stb)  # B never held the GPU alone
    assert g["kernel_active"] == 0.0 and close(g["shared"]["unattributed"], 1.0)
    assert g["memory_used_peak_bytes"] is None and "NVML listed none" in g["missing"]["memory_used_peak_bytes"]
    assert close(g["energy_j"], 0.5 * 400 * 15, 1e-3)  # idle-of-any-job power is split evenly


@pytest.mark.parametrize("restart", [True])
def test_shares_survive_an_agent_restart(tmp_path, restart):
    n = SharedNode(tmp_path)
    (a, sta), (b, stb) = n.two_jobs()
    n.fake.set_procs(U0, sm={501: 75, 502: 25}, memory={501: GiB, 502: GiB})
    n.ticks(4, **BUSY)
    n.agent.close()
    n.agent = Agent(n.cfg, n.fake, wall_clock=n.clock.wall, host="node1", proc_jobs=n.agent.proc_jobs)
    n.agent.open()
    n.ticks(4, **BUSY)
    g = n.epilog(a, sta)
    assert close(g["kernel_active"], 0.75, 1e-6)


def test_a_job_file_from_before_the_boot_holds_no_gpu(tmp_path):
    """A job killed by a reboot left its Prolog's file (no Epilog ran): the next job on its GPU is alone."""
    n = SharedNode(tmp_path)
    os.makedirs(os.path.join(n.cfg.paths.state_dir, "jobs"))
    ghost, _ = n.prolog(1001)
    os.utime(os.path.join(n.cfg.paths.state_dir, "jobs", "1001.json"), (1e9, 1e9))
    n.agent.booted_at = time.time() - 3600  # the ghost's file is older than the boot
    a, sta = n.prolog(1002)
    n.ticks(3, **BUSY)
    g = n.epilog(a, sta)
    assert "shared" not in g and close(g["kernel_active"], 1.0) and n.fake.proc_calls == []


def test_shared_gpu_hours_are_counted_once_and_the_card_says_with_whom(tmp_path):
    """The two jobs' records through the real spool, ingest, analysis, card and JSON: their GPU-hours on the
    shared GPU add up to the GPU's hours, once; each card names the other job and how its part was measured."""
    from sites import ingest_records, sim_record
    from sqlmodel import Session, select

    from slurm_gpueff.analysis.diagnose import assess
    from slurm_gpueff.analysis.figures import job_figures
    from slurm_gpueff.models import Job, JobGpu
    from slurm_gpueff.render.json import job_document
    from slurm_gpueff.render.text import render_card
    from slurm_gpueff.storage.db import make_engine

    n = SharedNode(tmp_path)
    fake_proc(n.proc, 501, V2.format(1001))
    fake_proc(n.proc, 502, V2.format(1002))
    os.makedirs(os.path.join(n.cfg.paths.state_dir, "jobs"))
    t0 = n.clock.wall()
    a, sta = n.prolog(1001)
    b, stb = n.prolog(1002)
    n.fake.set_procs(U0, sm={501: 80, 502: 20}, memory={501: 20 * GiB, 502: 2 * GiB})
    n.ticks(720, **BUSY)  # an hour together
    t1 = n.clock.wall()
    gb, ga = n.epilog(b, stb), n.epilog(a, sta)
    recs = [sim_record(j, "idle", 1, start=t0, end=t1, node="node1") | {"backend": "nvml-gpm", "gpus": [g]}
            for j, g in ((1001, ga), (1002, gb))]
    engine = make_engine(str(tmp_path / "jobs.db"))
    assert ingest_records(engine, tmp_path / "spool", recs).ingested == 2
    with Session(engine) as s:
        figs = {}
        for job in s.exec(select(Job)).all():
            row, gpus = rows_of_models(job, s.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all())
            figs[job.job_id] = (row, job_figures(row, gpus))
    (_ja, fa), (jb, fb) = figs[1001], figs[1002]
    hour = (t1 - t0) / 3600
    assert fa.hours == pytest.approx(hour / 2, rel=1e-3) and fb.hours == pytest.approx(hour / 2, rel=1e-3)
    assert fa.hours + fb.hours == pytest.approx(hour, rel=1e-3)  # the GPU's hour, counted once
    # A's kernels ran 80 % of the GPU's time: 100 % of its half (capped); B's 20 %: 40 % of its half.
    assert fa.mean("kernel_active") == pytest.approx(1.0) and fb.mean("kernel_active") == pytest.approx(0.4, abs=1e-3)
    assert fb.waste.idle_h == pytest.approx(hour / 2 * 0.6, rel=1e-2)
    assert fa.energy_j + fb.energy_j == pytest.approx(400 * (t1 - t0 - 5), rel=1e-2)
    card = render_card(jb, fb, assess(fb))
    assert "Shared GPU 0: with job 1001; this job's share 50.0%" in card.replace("\n    ", " ")
    assert "Slurm cgroup" in card.replace("\n    ", " ")
    js = job_document(jb, fb, assess(fb))
    sh = js["gpus"][0]["shared"]
    assert sh["with"] == ["1001"] and sh["share"] == 0.5 and sh["own"]["kernel_active"] == pytest.approx(0.2, abs=1e-3)
    engine.dispose()


def test_under_mps_no_job_gets_the_servers_kernel_time(tmp_path):
    """What NVML reports on an H100 with MPS clients (docs/gpu-validation/h100-gpu-share-*.log): each client
    listed with its own memory, every utilization sample on the MPS server's pid. The jobs' memory is their
    own; their activity and energy are n/a with the reason, never ~0 as if they had been idle."""
    n = SharedNode(tmp_path)
    fake_proc(n.proc, 600, "0::/system.slice/nvidia-mps.service\n", comm="nvidia-cuda-mps")  # as the kernel cuts comm
    (a, sta), (b, stb) = n.two_jobs()
    n.fake.set_procs(U0, sm={600: 99}, memory={600: 64 << 20, 501: 2 * GiB, 502: 3 * GiB})
    n.ticks(4, **BUSY)
    g = n.epilog(b, stb)
    assert g["kernel_active"] is None and "MPS server" in g["missing"]["kernel_active"]
    assert g["energy_j"] is None and "MPS" in g["missing"]["energy_j"]
    assert g["memory_used_peak_bytes"] == 3 * GiB and g["shared"]["unmeasured_s"] == pytest.approx(20.0)


def _job_series(agent):
    """The agent's per-job /metrics samples: (metric name, job id) -> value."""
    return {(s.name, s.labels["job_id"]): s.value for fam in agent.collect() for s in fam.samples
            if s.name.startswith("gpueff_job_gpu_")}


def test_per_job_metrics_of_a_shared_gpu_add_up_to_the_gpu(tmp_path):
    """Two jobs' live series on one GPU carry their parts of the last split, not the GPU's whole reading each;
    under MPS no part is measurable, so they carry no activity or power sample (never a made-up split)."""
    n = SharedNode(tmp_path)
    n.two_jobs()
    n.fake.set_procs(U0, sm={501: 75, 502: 25}, memory={501: 4 * GiB, 502: 2 * GiB})
    n.ticks(2, **BUSY)
    got = _job_series(n.agent)
    assert got[("gpueff_job_gpu_kernel_active_ratio", "1001")] == pytest.approx(0.75)
    assert got[("gpueff_job_gpu_sm_active_ratio", "1002")] == pytest.approx(0.8 * 0.25)
    assert got[("gpueff_job_gpu_power_watts", "1001")] + got[("gpueff_job_gpu_power_watts", "1002")] == \
        pytest.approx(400.0)
    assert got[("gpueff_job_gpu_memory_used_bytes", "1002")] == 2 * GiB
    fake_proc(n.proc, 600, "0::/system.slice/nvidia-mps.service\n", comm="nvidia-cuda-mps")
    n.fake.set_procs(U0, sm={600: 99}, memory={600: 64 << 20, 501: 4 * GiB, 502: 2 * GiB})
    n.ticks(1, **BUSY)
    got = _job_series(n.agent)
    assert not [k for k in got if k[0] != "gpueff_job_gpu_memory_used_bytes"]
    assert got[("gpueff_job_gpu_memory_used_bytes", "1001")] == 4 * GiB


def test_an_idle_shared_gpu_reads_no_process_utilization(tmp_path):
    """The per-process utilization call is the costly one; an interval with no kernel has nothing to split.
    The idle power is the price of holding the GPU: split evenly, and each job keeps its own memory."""
    n = SharedNode(tmp_path)
    (a, sta), (b, stb) = n.two_jobs()
    n.fake.set_procs(U0, sm={}, memory={501: 4 * GiB, 502: 2 * GiB})
    idle = {"kernel_pct": None, "power_mw": 70_000.0, "gpm": {"kernel_active": 0, "sm_active": 0, "tensor_active": 0}}
    n.fake.util_calls.clear()
    n.ticks(4, **idle)
    assert n.fake.util_calls and all(c == set() for c in n.fake.util_calls)
    n.fake.set_procs(U0, sm={501: 50, 502: 50}, memory={501: 4 * GiB, 502: 2 * GiB})
    n.ticks(2, **BUSY)
    assert n.fake.util_calls[-1] == {U0}
    g = n.epilog(b, stb)
    assert g["memory_used_peak_bytes"] == 2 * GiB and g["shared"]["unattributed"] == pytest.approx(0.0)
    assert close(g["kernel_active"], (4 * 0 + 2 * 0.5) / 6, 1e-6)
