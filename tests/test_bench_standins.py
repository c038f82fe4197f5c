"""The site bench's Slurm stand-ins (bench/slurm_standin.py) against the product's own Slurm runner and
parsers: the bench's figures for the idle-GPU pass and enrichment hold only if the programs it puts on the
service's path answer as Slurm's do. Real processes, started by the product's runner with the real argv; no
Slurm daemon (the stand-ins answer from a state file, which is what they are for)."""

from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from slurm_gpueff.slurm.commands import active_job, squeue_jobs
from slurm_gpueff.slurm.runner import SlurmRunner
from slurm_gpueff.slurm.sacct import SacctReader

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import slurm_standin  # noqa: E402

T0 = 1_790_000_000.0


@pytest.fixture
def site(tmp_path):
    state = str(tmp_path / "slurm" / "state.json")
    sacct = slurm_standin.install(str(tmp_path / "slurm"), state)
    jobs = {str(10_000_000 + i): ["u1", "a1", "gpu", "gpu00001", 1, T0, None, None, None] for i in range(40_000)}
    jobs["500"] = ["u2", "a2", "gpu", "gpu00007,gpu00008", 8, T0, T0 + 3600, 498, 2]
    slurm_standin.write_state(state, "scale", jobs)
    return sacct, sorted(int(i) for i in jobs if i != "500")


@pytest.mark.process
def test_squeue_answers_the_pass_in_pieces_and_fails_as_slurms_would_on_one_long_list(site):
    sacct, running = site
    runner = SlurmRunner(sacct)
    got = squeue_jobs(runner, [*running, 500])  # the ended job is not listed, as squeue would not
    assert len(got) == len(running) and {j.state for j in got.values()} == {"RUNNING"}
    assert active_job(runner, str(running[0])).user == "u1" and active_job(runner, "500") is None
    squeue = os.path.join(os.path.dirname(sacct), "squeue")
    with pytest.raises(OSError) as refused:  # one -j argument of 40,000 ids: past Linux's 128 KiB
        subprocess.run([squeue, "-h", "-a", "-j", ",".join(map(str, running))], check=False)
    assert refused.value.errno == errno.E2BIG


@pytest.mark.process
def test_sacct_json_and_steps_read_by_the_product_as_24_11s(site):
    sacct, _running = site
    (job,) = SacctReader(command=sacct, timeout_s=30, fmt="json").jobs([500])
    assert (job.job_id, job.user, job.account, job.gpu_count) == (500, "u2", "a2", 8)
    assert (job.array_job_id, job.array_task_id, job.nodelist) == (498, 2, "gpu[00007-00008]")
    assert job.end is not None and job.start is not None and job.end - job.start == 3600
    assert job.alloc_cpus == 64 and job.total_cpu_s is not None and job.max_rss_bytes is not None
