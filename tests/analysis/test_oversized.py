"""Verdict 6, oversized: small peak memory and low SM activity."""

from __future__ import annotations

from slurm_gpueff.analysis import assess

GiB = 1024**3
SMALL = dict(kernel_active=0.70, sm_active=0.30, tensor_active=0.2, dram_active=0.05, fp32_active=0.03,
             memory_used_peak_bytes=int(4.8 * GiB), memory_total_bytes=80 * GiB)


def test_small_model_on_big_gpu_is_oversized(figures):
    verdicts = assess(figures(SMALL)).verdicts
    assert [v.name for v in verdicts] == ["oversized"]
    assert "6.0%" in verdicts[0].why and "4.8 of 80.0 GiB" in verdicts[0].why
    assert any("MIG" in a for a in verdicts[0].advice)


def test_small_memory_but_busy_sms_is_not(figures):
    assert assess(figures(dict(SMALL, sm_active=0.6, tensor_active=0.5))).verdicts[0].name == "healthy"


def test_unknown_memory_size_is_not_assessed(figures):
    diag = assess(figures(dict(SMALL, memory_total_bytes=None,
                               missing={"memory_total_bytes": "NVML memory info failed"})))
    assert "oversized" not in [v.name for v in diag.verdicts]
    reasons = {s.name: s.reason for s in diag.skipped}
    assert reasons["oversized"] == "peak memory share: NVML memory info failed"
