"""Figures: GPU-hours, time-weighted means, the waste split, and honest unknowns (None, never 0)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from record_rows import from_record, gpu_of

from slurm_gpueff.analysis import job_figures
from slurm_gpueff.readmodel import GpuRow, JobRow

GiB = 1024**3
T0 = datetime(2025, 3, 1, 8, 0, 0)


def job(hours: float = 2.0, **kw) -> JobRow:
    return JobRow(cluster="c", job_id=7, start_time=T0, end_time=T0 + timedelta(hours=hours), **kw)


def gpu(index: int = 0, **kw) -> GpuRow:
    values = dict(kernel_active=0.9, sm_active=0.6, tensor_active=0.5, dram_active=0.2, sm_occupancy=0.3,
                  fp32_active=0.1, fp16_active=0.0, fp64_active=0.0, hmma_active=0.5, imma_active=0.0,
                  dfma_active=0.0, memory_used_peak_bytes=40 * GiB, memory_total_bytes=80 * GiB,
                  energy_j=400.0 * 7200, power_mean_w=400.0, source="nvml-gpm", samples=1440, missing={})
    values.update(kw)
    return gpu_of(job_pk=0, node="n1", gpu_index=index, **values)


def test_single_gpu_split_sums_to_allocated_hours():
    f = job_figures(job(), [gpu()])
    assert f.hours == pytest.approx(2.0)
    assert f.waste.idle_h == pytest.approx(2.0 * 0.1)
    assert f.waste.underfilled_h == pytest.approx(2.0 * 0.3)
    assert f.waste.sm_active_h == pytest.approx(2.0 * 0.6)
    assert f.waste.idle_h + f.waste.underfilled_h + f.waste.sm_active_h == pytest.approx(f.hours)
    assert f.efficiency == pytest.approx(0.6 / 0.9)
    assert f.memory_fraction == pytest.approx(0.5)
    assert f.energy_j == pytest.approx(400.0 * 7200)
    assert f.power_mean_w == pytest.approx(400.0)
    assert f.sources["kernel_active"] == "nvml-gpm" and f.sources["sm_active"] == "nvml-gpm"
    assert f.missing == {}


def test_unknown_kernel_activity_makes_the_split_unknown_not_zero():
    f = job_figures(job(), [gpu(kernel_active=None, missing={"kernel_active": "agent was stale"})])
    assert f.hours == pytest.approx(2.0)
    assert f.waste.idle_h is None and f.waste.underfilled_h is None and f.waste.sm_active_h is None
    assert "agent was stale" in f.waste.reason
    assert f.efficiency is None
    assert f.mean("kernel_active") is None
    assert f.missing["kernel_active"] == "agent was stale"
    assert f.sources["kernel_active"] == "none"


def test_unknown_sm_activity_keeps_idle_known():
    f = job_figures(job(), [gpu(sm_active=None, missing={"sm_active": "GPU has no GPM (pre-Hopper)"})])
    assert f.waste.idle_h == pytest.approx(0.2)
    assert f.waste.underfilled_h is None and f.waste.sm_active_h is None
    assert f.waste.reason == "SM activity not measured: GPU has no GPM (pre-Hopper)"
    assert f.efficiency is None and f.missing["efficiency"] == "GPU has no GPM (pre-Hopper)"


def test_zero_kernel_activity_has_no_efficiency():
    f = job_figures(job(), [gpu(kernel_active=0.0, sm_active=0.0)])
    assert f.efficiency is None
    assert "no kernel ever ran" in f.missing["efficiency"]
    assert f.waste.idle_h == pytest.approx(2.0) and f.waste.sm_active_h == 0.0


def test_sampling_noise_sm_above_kernel_still_sums_to_a():
    f = job_figures(job(), [gpu(kernel_active=0.50, sm_active=0.52)])
    assert f.efficiency == 1.0
    assert f.waste.underfilled_h == 0.0
    assert f.waste.idle_h + f.waste.sm_active_h == pytest.approx(2.0)


def test_job_means_are_weighted_by_each_gpus_hours():
    """GPU 0 held 3 h at k=0.9, GPU 1 held 1 h at k=0.1 -> k = (2.7 + 0.1) / 4 = 0.7."""
    g0 = gpu(0, kernel_active=0.9, start_time=T0, end_time=T0 + timedelta(hours=3))
    g1 = gpu(1, kernel_active=0.1, sm_active=0.05, start_time=T0, end_time=T0 + timedelta(hours=1))
    f = job_figures(job(3.0), [g0, g1])
    assert f.hours == pytest.approx(4.0)
    assert f.mean("kernel_active") == pytest.approx(0.7)
    assert f.waste.idle_h == pytest.approx(3 * 0.1 + 1 * 0.9)
    assert f.waste.idle_h + f.waste.underfilled_h + f.waste.sm_active_h == pytest.approx(4.0)


def test_partial_coverage_is_said_and_sums_stay_unknown():
    g0 = gpu(0, sm_active=0.6, energy_j=1000.0)
    g1 = gpu(1, sm_active=None, energy_j=None, missing={"sm_active": "GPM sample failed",
                                                        "energy_j": "counter not supported"})
    f = job_figures(job(), [g0, g1])
    assert f.mean("sm_active") == pytest.approx(0.6)   # mean of the GPU that measured it
    assert f.coverage["sm_active"] == 1
    assert f.missing["sm_active"] == "GPM sample failed on 1 of 2 GPUs"
    assert f.waste.idle_h == pytest.approx(0.4)        # k known on both
    assert f.waste.sm_active_h is None and "n1:1" in f.waste.reason
    assert f.energy_j is None and f.missing["energy_j"] == "counter not supported"


def test_memory_is_the_fullest_gpu():
    f = job_figures(job(), [gpu(0, memory_used_peak_bytes=10 * GiB), gpu(1, memory_used_peak_bytes=70 * GiB)])
    assert f.memory_used_peak_bytes == 70 * GiB and f.memory_total_bytes == 80 * GiB
    assert f.memory_fraction == pytest.approx(70 / 80)


def test_allocation_only_job_has_no_invented_figures():
    reason = "no GPU collector running on this node"
    missing = {m: reason for m in ("kernel_active", "sm_active", "tensor_active", "dram_active",
                                   "sm_occupancy", "fp32_active", "fp16_active", "fp64_active", "hmma_active",
                                   "imma_active", "dfma_active", "memory_used_peak_bytes", "energy_j",
                                   "power_mean_w")}
    g = gpu(kernel_active=None, sm_active=None, tensor_active=None, dram_active=None, sm_occupancy=None,
            fp32_active=None, memory_used_peak_bytes=None, memory_total_bytes=None, energy_j=None,
            power_mean_w=None, source="none", samples=0, missing=missing)
    f = job_figures(job(), [g])
    assert f.hours == pytest.approx(2.0)
    for m in ("kernel_active", "sm_active", "tensor_active", "dram_active"):
        assert f.mean(m) is None and f.missing[m] == reason
    assert f.energy_j is None and f.memory_used_peak_bytes is None and f.power_mean_w is None
    assert f.waste.idle_h is None and reason in f.waste.reason


def test_unknown_times_leave_hours_unknown():
    j = JobRow(cluster="c", job_id=8)
    f = job_figures(j, [gpu()])
    assert f.hours is None and f.waste.idle_h is None
    assert f.mean("kernel_active") == pytest.approx(0.9)  # means do not need the time


def test_from_record_matches_the_record():
    rec = {"schema": 1, "cluster": "c", "node": "n9", "job_id": 55, "array_job_id": 50, "array_task_id": 5,
           "start_time": 1_740_000_000.0, "end_time": 1_740_003_600.0, "backend": "nvml", "user": "u",
           "gpus": [{"index": 2, "model": "NVIDIA A100", "kernel_active": 0.4, "sm_active": None,
                     "memory_used_peak_bytes": 1024, "memory_total_bytes": 4096, "source": "nvml",
                     "samples": 720, "missing": {"sm_active": "no GPM"}}]}
    j, gpus = from_record(rec)
    assert (j.job_id, j.array_job_id, j.array_task_id) == (55, 50, 5)
    assert (j.gpu_count, j.gpu_type) == (1, "NVIDIA A100")
    f = job_figures(j, gpus)
    assert f.hours == pytest.approx(1.0)
    assert f.gpus[0].label == "n9:2"
    assert f.missing["sm_active"] == "no GPM"
    assert f.memory_fraction == pytest.approx(0.25)


def test_a_shared_gpu_counts_the_jobs_share_and_never_the_devices_activity_as_its_own():
    """3 of a GPU's 4 shards (Slurm gres/shard) for 2 hours: 1.5 GPU-hours; what the GPU measured is every
    job's on it, so no activity, memory or energy is the job's own and its waste is not known."""
    f = job_figures(job(), [gpu(shards=3, shard_count=4)])
    assert f.hours == pytest.approx(1.5)
    assert f.mean("kernel_active") is None and f.energy_j is None and f.memory_used_peak_bytes is None
    assert f.waste.idle_h is None and f.gpus[0].shards == 3 and f.gpus[0].shard_count == 4
    assert f.missing["kernel_active"].startswith("the shared GPU's as a whole (3 of its 4 shards")
    unknown = job_figures(job(), [gpu(shards=3, shard_count=None)])
    assert unknown.hours is None and "shard count is unknown" in unknown.missing["gpu_hours"]
    whole = job_figures(job(), [gpu()])
    assert whole.hours == pytest.approx(2.0) and whole.gpus[0].shards is None  # a GPU held whole: as before


def _shared(own_k: float, own_s: float, gpu_busy: float, **kw) -> GpuRow:
    return gpu(kernel_active=own_k, sm_active=own_s, tensor_active=0.0, hmma_active=0.0, **kw,
               shared={"with": ["1002"], "with_count": 1, "method": "split by NVML's per-process SM utilization",
                       "share": 0.5, "shared_s": 7200.0, "unattributed": 0.0, "gpu_kernel_active": gpu_busy})


def test_a_measured_share_counts_its_hours_and_reads_its_means_relative_to_it():
    f = job_figures(job(), [_shared(0.4, 0.3, 0.8)])
    g = f.gpus[0]
    assert f.hours == pytest.approx(1.0) and g.share == 0.5  # 2 h at half the GPU: the GPU's hours once
    assert g.mean("kernel_active") == pytest.approx(0.8) and g.own["kernel_active"] == pytest.approx(0.4)
    assert g.mean("sm_occupancy") is None and "no per-job part" in g.missing["sm_occupancy"]
    assert f.waste.idle_h == pytest.approx(0.2)  # its 1 GPU-hour x (1 - 0.8)


def test_on_a_shared_gpu_oversized_says_fewer_shards_and_starved_names_the_neighbours():
    from slurm_gpueff.analysis.diagnose import assess

    small = job_figures(job(), [_shared(0.04, 0.02, 0.3, shards=8, shard_count=16,
                                        memory_used_peak_bytes=2 * GiB)])
    titles = [v.title for v in assess(small).verdicts]
    v = next(v for v in assess(small).verdicts if v.name == "oversized")
    assert v.title == "Oversized: a smaller share would do", titles
    assert "8 of the GPU's 16 shards" in v.why and "1 shard (--gres=shard:1)" in v.why
    crowded = job_figures(job(), [_shared(0.1, 0.09, 0.97)])
    s = next(v for v in assess(crowded).verdicts if v.name == "starved")
    assert s.title == "Starved: the shared GPU was busy with other jobs" and "1002" in s.why and "97.0%" in s.why
    alone = job_figures(job(), [gpu(kernel_active=0.2)])
    assert next(v for v in assess(alone).verdicts if v.name == "starved").title == "Starved: GPU mostly waiting"
