"""Verdict 4, tensor cores idle: SMs fairly busy, tensor pipe ~0, FP32 pipe busy."""

from __future__ import annotations

from slurm_gpueff.analysis import assess

FP32 = dict(kernel_active=0.98, sm_active=0.79, tensor_active=0.0, dram_active=0.15, fp32_active=0.63,
            memory_used_peak_bytes=40 * 1024**3)


def test_fp32_matmuls_leave_tensor_cores_idle(figures):
    verdicts = assess(figures(FP32)).verdicts
    assert [v.name for v in verdicts] == ["tensor_idle"]
    assert "79.0%" in verdicts[0].why and "63.0%" in verdicts[0].why
    assert any("bf16" in a for a in verdicts[0].advice)


def test_tensor_in_use_is_not_idle(figures):
    assert "tensor_idle" not in [v.name for v in assess(figures(dict(FP32, tensor_active=0.05))).verdicts]


def test_fp32_pipe_quiet_is_not_tensor_idle(figures):
    """Low tensor with a quiet FP32 pipe is some other shape of work (e.g. integer or memory)."""
    assert "tensor_idle" not in [v.name for v in assess(figures(dict(FP32, fp32_active=0.05))).verdicts]


def test_unmeasured_fp32_is_not_assessed(figures):
    diag = assess(figures(dict(FP32, fp32_active=None, missing={"fp32_active": "not supported by DCGM 3"})))
    assert "tensor_idle" not in [v.name for v in diag.verdicts]
    assert {s.name: s.reason for s in diag.skipped}["tensor_idle"] == "FP32 activity: not supported by DCGM 3"
