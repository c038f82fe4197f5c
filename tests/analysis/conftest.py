"""Build a job's figures from inline per-GPU numbers, through the real models and analysis code."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from record_rows import gpu_of

from slurm_gpueff.analysis import job_figures
from slurm_gpueff.readmodel import JobRow

GiB = 1024**3
START = datetime(2025, 3, 1, 8, 0, 0)

# A healthy bf16 GPU; tests override what they care about.
HEALTHY: dict[str, Any] = dict(kernel_active=0.97, sm_active=0.82, sm_occupancy=0.35, tensor_active=0.78,
                               dram_active=0.22, fp64_active=0.0, fp32_active=0.08, fp16_active=0.05,
                               memory_used_peak_bytes=68 * GiB, memory_total_bytes=80 * GiB,
                               energy_j=610.0 * 7200, power_mean_w=610.0)


def build(*gpus: dict[str, Any], hours: float = 2.0, source: str = "nvml-gpm", node: str = "gpu01",
          **job_fields: Any):
    """Job figures for one job whose GPUs have the given figures (a key set to None = not measured;
    put reasons in ``missing``); ``job_fields`` set the job's own (e.g. alloc_cpus, total_cpu_s)."""
    end = START + timedelta(hours=hours)
    job = JobRow(cluster="c", job_id=1, start_time=START, end_time=end, gpu_count=len(gpus), backend=source,
              **job_fields)
    rows = []
    for i, spec in enumerate(gpus):
        values = dict(HEALTHY)
        values.update(spec)
        missing = values.pop("missing", {})
        rows.append(gpu_of(job_pk=0, node=node, gpu_index=i, model="NVIDIA H100 80GB HBM3", source=source,
                           samples=100, missing=missing, **values))
    return job_figures(job, rows)


@pytest.fixture
def figures():
    return build
