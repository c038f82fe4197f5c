"""Verdict 2, starved: kernel activity low (but above never-used)."""

from __future__ import annotations

from slurm_gpueff.analysis import assess

STARVED = dict(kernel_active=0.25, sm_active=0.20, tensor_active=0.18, dram_active=0.05, fp32_active=0.02,
               memory_used_peak_bytes=48 * 1024**3)


def test_low_kernel_activity_is_starved(figures):
    verdicts = assess(figures(STARVED)).verdicts
    assert verdicts[0].name == "starved"
    assert "25.0%" in verdicts[0].why and "under 50.0%" in verdicts[0].why
    assert " on " not in verdicts[0].why.split("(")[0]  # all GPUs: no "on 1 of 2 GPUs"


def test_just_above_threshold_is_not_starved(figures):
    assert "starved" not in [v.name for v in assess(figures(dict(kernel_active=0.51, sm_active=0.45))).verdicts]


def test_one_of_two_gpus_starved_names_it(figures):
    verdicts = assess(figures({}, STARVED)).verdicts
    assert verdicts[0].name == "starved"
    assert verdicts[0].gpus == [("gpu01", 1)]
    assert "on 1 of 2 GPUs (gpu01:1)" in verdicts[0].why


def test_never_used_and_almost_idle_gpus_are_not_also_starved(figures):
    nearly = dict(kernel_active=0.01, sm_active=0.0)
    assert [v.name for v in assess(figures(nearly, nearly)).verdicts] == ["nearly_idle"]
    never = dict(kernel_active=0.0, sm_active=0.0)
    assert [v.name for v in assess(figures(never, never)).verdicts] == ["never_used"]
