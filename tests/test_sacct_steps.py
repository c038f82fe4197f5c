"""The CPU side from sacct's step lines: TotalCPU summed over steps, the largest MaxRSS, AllocCPUS.

The lines are written in the exact ``sacct -P -n -o JobIDRaw,JobID,AllocCPUS,TotalCPU,MaxRSS`` form of
Slurm 22.05-26.05 (the same in every version); tests/slurm/test_slurm_cpu.py reads real ones from each.
"""

from __future__ import annotations

import pytest

from slurm_gpueff.slurm.sacct_rows import SacctJob
from slurm_gpueff.slurm.sacct_steps import attach, cpu_seconds, parse_steps, size_bytes

STEPS = """\
11|11|8|02:10.500|
11.batch|11.batch|8|01:00.250|1843200K
11.extern|11.extern|8|00:00.001|1024K
11.0|11.0|8|01:10.249|2.50G
12|12|2|00:00:00|
13|13|4|1-02:03:04|
13.batch|13.batch|4|INVALID|
sacct: warning: this line is not ours
"""


@pytest.mark.parametrize(("text", "seconds"), [
    ("00:02.345", 2.345), ("01:02.5", 62.5), ("1:02:03", 3723.0), ("1-02:03:04", 93784.0),
    ("10-00:00:00", 864000.0), ("", None), ("INVALID", None), ("16?", None), ("12", None)])
def test_totalcpu_formats(text, seconds):
    assert cpu_seconds(text) == seconds


@pytest.mark.parametrize(("text", "size"), [
    ("1843200K", 1843200 * 1024), ("2.50G", int(2.5 * 1024**3)), ("0", 0), ("12M", 12 * 1024**2), ("", None),
    ("n/a", None), ("9" * 30 + "P", None)])
def test_maxrss_formats(text, size):
    assert size_bytes(text) == size


def test_steps_add_up_and_the_largest_rss_wins():
    use = parse_steps(STEPS)
    assert use[11].alloc_cpus == 8 and use[11].total_cpu_s == pytest.approx(130.5)  # the steps, not the job line
    assert use[11].max_rss_bytes == int(2.5 * 1024**3)
    # no steps: the allocation line's TotalCPU; no MaxRSS anywhere: unknown, not 0
    assert (use[12].alloc_cpus, use[12].total_cpu_s, use[12].max_rss_bytes) == (2, 0.0, None)
    # a step whose TotalCPU is unreadable: the allocation line's figure stands in
    assert use[13].total_cpu_s == 93784.0 and use[13].max_rss_bytes is None


def test_only_the_latest_run_of_a_requeued_job_gets_the_steps():
    first = SacctJob(job_id=11, job_id_text="11", start=100.0, run=0)
    last = SacctJob(job_id=11, job_id_text="11", start=500.0, run=1)
    attach([last, first], parse_steps(STEPS))
    assert last.total_cpu_s == pytest.approx(130.5) and first.total_cpu_s is None
