"""Verdict 5, memory-bound: DRAM busy, tensor low."""

from __future__ import annotations

from slurm_gpueff.analysis import assess

MEM = dict(kernel_active=0.99, sm_active=0.80, sm_occupancy=0.6, tensor_active=0.0, dram_active=0.85,
           fp32_active=0.05, memory_used_peak_bytes=56 * 1024**3)


def test_dram_saturated_is_memory_bound(figures):
    verdicts = assess(figures(MEM)).verdicts
    assert [v.name for v in verdicts] == ["memory_bound"]
    assert "85.0%" in verdicts[0].why
    assert any("FlashAttention" in a for a in verdicts[0].advice)


def test_dram_busy_with_tensor_cores_busy_is_not(figures):
    assert assess(figures(dict(MEM, tensor_active=0.6))).verdicts[0].name == "healthy"


def test_dram_below_threshold_is_not(figures):
    assert "memory_bound" not in [v.name for v in assess(figures(dict(MEM, dram_active=0.49))).verdicts]
    lower = {"memory_bound_dram_pct": 40}
    assert assess(figures(dict(MEM, dram_active=0.49)), lower).verdicts[0].name == "memory_bound"


def test_unmeasured_dram_is_not_assessed(figures):
    diag = assess(figures(dict(MEM, dram_active=None, missing={"dram_active": "GPM metric returned NaN"})))
    assert [v.name for v in diag.verdicts] == []
    assert {s.name for s in diag.skipped} == {"memory_bound", "healthy"}
