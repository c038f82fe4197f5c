"""Verdict 3, busy but not working: "100 % GPU utilization" with few SMs active."""

from __future__ import annotations

from slurm_gpueff.analysis import assess

SPIN = dict(kernel_active=1.0, sm_active=0.0076, sm_occupancy=0.0001, tensor_active=0.0, dram_active=0.0,
            fp32_active=0.0, memory_used_peak_bytes=40 * 1024**3)


def test_one_block_spin_is_busy_not_working(figures):
    verdicts = assess(figures(SPIN)).verdicts
    assert verdicts[0].name == "busy_not_working"
    assert "100.0%" in verdicts[0].why and "0.8%" in verdicts[0].why


def test_busy_with_many_sms_is_not(figures):
    assert "busy_not_working" not in [v.name for v in assess(figures(dict(SPIN, sm_active=0.35))).verdicts]


def test_kernel_activity_below_busy_threshold_is_not(figures):
    names = [v.name for v in assess(figures(dict(SPIN, kernel_active=0.79, sm_active=0.2))).verdicts]
    assert "busy_not_working" not in names


def test_launch_bound_tiny_kernels_are_starved_and_underfilled(figures):
    """Measured on an H100: a Python loop of 1000-element adds, kernel 32.7 %, SM 0.05 %."""
    verdicts = assess(figures(dict(SPIN, kernel_active=0.327, sm_active=0.0005))).verdicts
    assert [v.name for v in verdicts][:2] == ["starved", "busy_not_working"]
    assert "32.7%" in verdicts[1].why and "0.05%" in verdicts[1].why


def test_efficiency_rule_follows_its_threshold(figures):
    gpu = dict(SPIN, kernel_active=0.5, sm_active=0.04)  # efficiency 8 %
    assert "busy_not_working" in [v.name for v in assess(figures(gpu)).verdicts]
    names = [v.name for v in assess(figures(gpu), {"busy_efficiency_pct": 5.0}).verdicts]
    assert "busy_not_working" not in names


def test_without_sm_activity_it_is_not_assessed(figures):
    """nvml backend on a pre-Hopper GPU: kernel activity known, SM activity not (no GPM)."""
    no_gpm = "GPU has no GPM (pre-Hopper)"
    gpu = dict(SPIN, sm_active=None, sm_occupancy=None, tensor_active=None, dram_active=None,
               fp32_active=None, fp16_active=None, fp64_active=None,
               missing={m: no_gpm for m in ("sm_active", "sm_occupancy", "tensor_active", "dram_active",
                                            "fp32_active", "fp16_active", "fp64_active")})
    diag = assess(figures(gpu, source="nvml"))
    assert diag.verdicts == []  # neither busy-not-working nor healthy: we cannot tell
    skipped = {s.name: s.reason for s in diag.skipped}
    assert skipped["busy_not_working"] == f"SM activity: {no_gpm}"
    assert set(skipped) == {"busy_not_working", "tensor_idle", "memory_bound", "oversized", "healthy"}
