"""Verdict 1, GPU never used: judged per GPU; says which of N GPUs; idle GPUs leave the later checks."""

from __future__ import annotations

from slurm_gpueff.analysis import assess

IDLE = dict(kernel_active=0.0, sm_active=0.0, sm_occupancy=0.0, tensor_active=0.0, dram_active=0.0,
            fp32_active=0.0, fp16_active=0.0, memory_used_peak_bytes=400 * 1024**2, power_mean_w=70.0)


def test_single_idle_gpu_is_never_used(figures):
    verdicts = assess(figures(IDLE)).verdicts
    assert [v.name for v in verdicts] == ["never_used"]  # not also starved / oversized
    v = verdicts[0]
    assert v.title == "GPU never used"
    assert v.severity == "critical"
    assert "0.0%" in v.why and "2.00 GPU-hours" in v.why
    assert 2 <= len(v.advice) <= 3
    assert v.gpus == [("gpu01", 0)]


def test_three_of_four_gpus_never_used(figures):
    verdicts = assess(figures({}, IDLE, IDLE, IDLE)).verdicts
    assert verdicts[0].name == "never_used"
    assert verdicts[0].title == "3 of 4 GPUs never used"
    assert verdicts[0].gpus == [("gpu01", 1), ("gpu01", 2), ("gpu01", 3)]
    assert "gpu01:1, gpu01:2, gpu01:3" in verdicts[0].why
    assert "6.00 GPU-hours" in verdicts[0].why  # 3 GPUs x 2 h
    # The used GPU is healthy, but the job is not called healthy.
    assert [v.name for v in verdicts] == ["never_used"]


def test_threshold_is_strict_and_configurable(figures):
    at = figures(dict(kernel_active=0.05))
    assert "never_used" not in [v.name for v in assess(at).verdicts]
    assert assess(at, {"never_used_kernel_pct": 6.0}).verdicts[0].name == "never_used"


def test_unmeasured_kernel_activity_is_not_assessed(figures):
    diag = assess(figures(dict(kernel_active=None, missing={"kernel_active": "agent was not running"})))
    assert "never_used" not in [v.name for v in diag.verdicts]
    skipped = {s.name: s.reason for s in diag.skipped}
    assert "agent was not running" in skipped["never_used"]
    assert "healthy" in skipped  # never claim healthy when a check could not run
