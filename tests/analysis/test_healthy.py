"""Verdict 7, healthy: only when every check ran and none found a problem."""

from __future__ import annotations

from slurm_gpueff.analysis import assess


def test_bf16_training_is_healthy(figures):
    diag = assess(figures({}, {}))
    assert [v.name for v in diag.verdicts] == ["healthy"]
    assert diag.skipped == []
    v = diag.primary
    assert v is not None and v.severity == "ok"
    assert "both GPUs were doing real work" in v.why
    assert v.gpus == [("gpu01", 0), ("gpu01", 1)]


def test_healthy_is_never_added_to_a_problem(figures):
    names = [v.name for v in assess(figures({}, dict(kernel_active=0.3, sm_active=0.25))).verdicts]
    assert names == ["starved"]


def test_not_healthy_when_tensor_activity_unknown(figures):
    diag = assess(figures(dict(tensor_active=None)))
    assert diag.verdicts == []
    assert "tensor activity: not measured" in {s.reason for s in diag.skipped}


def test_too_short_jobs_get_no_verdict(figures):
    diag = assess(figures({}, hours=0.05), {"min_gpu_hours": 0.1})
    assert diag.verdicts == []
    assert "too short" in diag.skipped[0].reason
