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
    assert not {"never_used", "nearly_idle"} & {v.name for v in assess(at).verdicts}
    assert assess(at, {"never_used_kernel_pct": 6.0}).verdicts[0].name == "nearly_idle"


def test_never_used_means_no_kernel_ever_ran(figures):
    """A GPU with some kernel activity, however little, was used: it is "almost idle", not "never used"."""
    zero = assess(figures(IDLE)).verdicts[0]
    assert zero.name == "never_used" and "no kernel ever ran" in zero.why
    nearly = assess(figures(dict(IDLE, kernel_active=0.00011, sm_active=0.002))).verdicts
    assert [v.name for v in nearly] == ["nearly_idle"]  # not also starved
    assert nearly[0].title == "GPU almost idle" and nearly[0].severity == "critical"
    assert "never" not in nearly[0].title.lower() and "a kernel ran only" in nearly[0].why
    assert "CPU efficiency is not known" in nearly[0].why  # no CPU figures: said so


def test_almost_idle_says_what_the_cpus_did(figures):
    busy = assess(figures(dict(IDLE, kernel_active=0.0002), alloc_cpus=8, total_cpu_s=8 * 7200 * 0.95)).verdicts[0]
    assert busy.name == "nearly_idle" and busy.title == "GPU almost idle, work on the CPU"
    assert "8 CPUs were busy 95.0%" in busy.why
    idle = assess(figures(dict(IDLE, kernel_active=0.0002), alloc_cpus=8, total_cpu_s=8 * 7200 * 0.01)).verdicts[0]
    assert idle.title == "GPU almost idle, CPUs idle too" and "busy only 1.0%" in idle.why


def test_unmeasured_kernel_activity_is_not_assessed(figures):
    diag = assess(figures(dict(kernel_active=None, missing={"kernel_active": "agent was not running"})))
    assert "never_used" not in [v.name for v in diag.verdicts]
    skipped = {s.name: s.reason for s in diag.skipped}
    assert "agent was not running" in skipped["never_used"]
    assert "healthy" in skipped  # never claim healthy when a check could not run
