"""Short jobs: their figures, and no verdict that blames the owner; the card says why and what it covers."""

from __future__ import annotations

from datetime import timedelta

from conftest import START, build
from record_rows import gpu_of

from slurm_gpueff.analysis import assess, job_figures
from slurm_gpueff.readmodel import JobRow
from slurm_gpueff.render.text import render_card

STARVED = dict(kernel_active=0.40, sm_active=0.30)


def _gap_window(start: float, end: float, gaps: list[list[object]]) -> dict[str, object]:
    return {"start": start, "end": end, "start_offset_s": 0.0, "end_offset_s": 0.0, "start_exact": True,
            "end_exact": True, "gaps": gaps, "break": None}


def test_a_14_second_window_gets_figures_and_no_verdict():
    fig = build(dict(STARVED, measured_s=14.0, window_s=14.0))
    diag = assess(fig)
    assert fig.mean("kernel_active") == 0.40 and diag.verdicts == []
    (skip,) = diag.skipped
    assert "measured 14 s, under analysis.short_job_s = 60 s" in skip.reason


def test_the_same_job_measured_longer_is_judged():
    assert [v.name for v in assess(build(dict(STARVED, measured_s=600.0, window_s=600.0))).verdicts] == ["starved"]
    assert assess(build(dict(STARVED, measured_s=14.0)), {"short_job_s": 10}).verdicts[0].name == "starved"


def test_without_a_measured_window_the_allocated_time_decides():
    fig = build(dict(STARVED), hours=30 / 3600)  # e.g. the dcgm or simulated backend
    assert fig.measured_s == 30.0 and assess(fig).verdicts == []


def test_the_card_says_how_much_was_measured_and_why_there_is_no_verdict():
    t0 = START.timestamp()
    job = JobRow(cluster="c", job_id=7, start_time=START, end_time=START + timedelta(seconds=45), gpu_count=1,
              backend="nvml-gpm", user="alice", account="research")
    gpu = gpu_of(job_pk=0, node="gpu01", gpu_index=0, source="nvml-gpm", samples=9, kernel_active=0.9,
                 sm_active=0.7, window_s=45.0, measured_s=32.0,
                 window=_gap_window(t0, t0 + 45, [[t0 + 11, t0 + 24, "agent not running (killed or crashed)"]]))
    fig = job_figures(job, [gpu])
    card = " ".join(render_card(job, fig, assess(fig)).split())  # as read, whatever the wrapping
    assert "measured 32 of 45 s; agent down 08:00:11-08:00:24 (agent not running (killed or crashed))" in card
    assert "too short to judge: measured 32 s" in card and "Verdict: none" in card
