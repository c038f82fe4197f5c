"""The CPU side of the diagnosis: CPU efficiency from accounting, and "Starved" saying which case it is."""

from __future__ import annotations

from dataclasses import replace

from conftest import START, build

from slurm_gpueff.analysis import assess
from slurm_gpueff.analysis.cpu import cpu_figures
from slurm_gpueff.readmodel import JobRow
from slurm_gpueff.render.jobs_table import render as render_table
from slurm_gpueff.render.json import job_document
from slurm_gpueff.render.text import render_card

STARVED = dict(kernel_active=0.30, sm_active=0.25)


def _with_cpu(cpus: int | None, total: float | None, rss: int | None = 12 * 2**30, enriched: bool = True):
    fig = build(dict(STARVED))  # 2 h elapsed
    job = JobRow(cluster="c", job_id=1, start_time=START, alloc_cpus=cpus, total_cpu_s=total, max_rss_bytes=rss,
              enriched=enriched, elapsed_s=7200.0)
    fig.cpu = cpu_figures(job, 7200.0)
    return job, fig


def test_cpu_efficiency_is_totalcpu_over_elapsed_times_cpus():
    _job, fig = _with_cpu(8, 8 * 7200 * 0.93)
    assert abs(fig.cpu.efficiency - 0.93) < 1e-9 and fig.cpu.missing == {}


def test_starved_with_saturated_cpus_asks_for_more_cpus_or_workers():
    _job, fig = _with_cpu(8, 8 * 7200 * 0.95)
    (v,) = [v for v in assess(fig).verdicts if v.name == "starved"]
    assert v.title == "Starved: CPUs saturated" and "8 CPUs were busy 95.0%" in v.why
    assert "--cpus-per-task" in v.advice[0]


def test_starved_with_idle_cpus_points_at_waiting():
    _job, fig = _with_cpu(8, 8 * 7200 * 0.10)
    (v,) = [v for v in assess(fig).verdicts if v.name == "starved"]
    assert v.title == "Starved: waiting, CPUs idle too" and "busy only 10.0%" in v.why and "I/O" in v.why


def test_starved_between_or_unknown_says_so():
    _job, fig = _with_cpu(8, 8 * 7200 * 0.65)
    (v,) = [v for v in assess(fig).verdicts if v.name == "starved"]
    assert v.title == "Starved: GPU mostly waiting" and "busy 65.0% of the time, which does not tell" in v.why
    _job, fig = _with_cpu(None, None, enriched=False)
    (v,) = [v for v in assess(fig).verdicts if v.name == "starved"]
    assert "CPU efficiency is not known (Slurm's accounting not read yet)" in v.why


def test_card_json_and_table_show_the_cpu_side():
    job, fig = _with_cpu(8, 8 * 7200 * 0.5)
    card = " ".join(render_card(job, fig, assess(fig)).split())  # as read, whatever the wrapping
    assert "CPU: efficiency 50.0% of 8 CPUs (TotalCPU 08:00:00), peak host memory 12.0 GiB" in card
    doc = job_document(job, fig, assess(fig))
    assert doc["cpu"]["efficiency"] == 0.5 and doc["cpu"]["max_rss_bytes"] == 12 * 2**30
    job2, fig2 = _with_cpu(None, None, rss=None)
    assert "CPU:" not in render_card(job2, fig2, assess(fig2))  # accounting read, and it holds none: no line
    job3, fig3 = _with_cpu(None, None, rss=None, enriched=False)
    assert ("CPU: not known yet: CPU time and peak host memory come from Slurm's accounting, read after the job"
            in " ".join(render_card(job3, fig3, assess(fig3)).split()))
    job = replace(job, gpu_count=1, gpu_hours=2.0, state="COMPLETED")
    table = render_table([job, job2])
    assert "CPU%" in table.splitlines()[0] and "50.0%" in table and "n/a" in table
