"""The machine-readable job document (``seff-gpu --json``). Stable: fields are only ever added.

Shape (``SCHEMA_VERSION`` 1; fractions in [0, 1]; times ISO 8601 UTC; unmeasured = null + reason)::

    {"schema": "slurm-gpueff/seff-gpu", "schema_version": 1, "jobs": [JOB, ...]}

    JOB = {"job": {"id": "123_4", "job_id": 127, "cluster", "array_job_id", "array_task_id",
                   "het_job_id", "het_job_offset", "user", "account", "partition", "state",
                   "state_text", "exit_code", "signal", "nodes": [..], "gpu_count", "gpu_model",
                   "start_time", "end_time", "elapsed_s", "backend", "reason"},
           "figures": {NAME: {"value": number|null, "source": str, "missing": str|null}, ...},
           "waste": {"gpu_hours", "idle_gpu_hours", "underfilled_gpu_hours", "sm_active_gpu_hours",
                     "reason"},
           "verdicts": [{"name", "title", "severity", "why", "advice": [..],
                         "gpus": [{"node", "index"}]}],          # primary first
           "not_assessed": [{"name", "title", "reason"}],
           "gpus": [{"node", "index", "uuid", "model", "source", "samples", "gpu_hours",
                     "kernel_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active",
                     "fp32_active", "fp16_active", "fp64_active", "efficiency",
                     "memory_used_peak_bytes", "memory_total_bytes", "energy_j", "power_mean_w",
                     "waste": {...}, "missing": {metric: reason}}]}

Figure names: gpu_hours, kernel_active, sm_active, efficiency, tensor_active, dram_active, sm_occupancy,
fp32_active, fp16_active, fp64_active, memory_used_peak_bytes, memory_total_bytes, memory_fraction,
energy_j, power_mean_w. ``missing`` on a figure with a value means it was measured on some GPUs only.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..analysis.diagnose import Diagnosis
from ..analysis.figures import MEANS, GpuFigures, JobFigures, Waste
from ..fmt import iso, job_label
from .text import state_text

if TYPE_CHECKING:  # an ORM row or a plain row of storage.sqlite_read: only attributes are read
    from ..models import Job

SCHEMA = "slurm-gpueff/seff-gpu"
SCHEMA_VERSION = 1


def _num(x: float | None, digits: int = 6) -> float | None:
    return None if x is None else round(float(x), digits)


def _waste(w: Waste, hours: float | None) -> dict[str, Any]:
    return {"gpu_hours": _num(hours), "idle_gpu_hours": _num(w.idle_h),
            "underfilled_gpu_hours": _num(w.underfilled_h), "sm_active_gpu_hours": _num(w.sm_active_h),
            "reason": w.reason}


def _figures(fig: JobFigures) -> dict[str, Any]:
    m, src = fig.missing, fig.sources
    out: dict[str, Any] = {
        "gpu_hours": {"value": _num(fig.hours), "source": "slurm", "missing": m.get("gpu_hours")},
    }
    for name in MEANS:
        out[name] = {"value": _num(fig.mean(name)), "source": src.get(name, "none"), "missing": m.get(name)}
    out["efficiency"] = {"value": _num(fig.efficiency), "source": src.get("efficiency", "none"),
                         "missing": m.get("efficiency")}
    mem_src = src.get("memory", "none")
    for name, value in (("memory_used_peak_bytes", fig.memory_used_peak_bytes),
                        ("memory_total_bytes", fig.memory_total_bytes)):
        out[name] = {"value": value, "source": mem_src, "missing": m.get("memory") if value is None else None}
    out["memory_fraction"] = {"value": _num(fig.memory_fraction), "source": mem_src,
                              "missing": m.get("memory")}
    out["energy_j"] = {"value": _num(fig.energy_j, 1), "source": src.get("energy_j", "none"),
                       "missing": m.get("energy_j")}
    out["power_mean_w"] = {"value": _num(fig.power_mean_w, 1), "source": src.get("power_mean_w", "none"),
                           "missing": m.get("power_mean_w")}
    return out


def _gpu(g: GpuFigures) -> dict[str, Any]:
    d: dict[str, Any] = {"node": g.node, "index": g.index, "uuid": g.uuid, "model": g.model,
                         "source": g.source, "samples": g.samples, "gpu_hours": _num(g.hours)}
    for name in MEANS:
        d[name] = _num(g.mean(name))
    d["efficiency"] = _num(g.efficiency)
    d["memory_used_peak_bytes"] = g.memory_used_peak_bytes
    d["memory_total_bytes"] = g.memory_total_bytes
    d["energy_j"] = _num(g.energy_j, 1)
    d["power_mean_w"] = _num(g.power_mean_w, 1)
    d["waste"] = _waste(g.waste, g.hours)
    d["missing"] = dict(sorted(g.missing.items()))
    return d


def job_document(job: Job, fig: JobFigures, diag: Diagnosis) -> dict[str, Any]:
    """One job's document (an element of ``jobs``)."""
    nodes = list(dict.fromkeys(g.node for g in fig.gpus)) or ([job.nodelist] if job.nodelist else [])
    models = list(dict.fromkeys(g.model for g in fig.gpus if g.model))
    return {
        "job": {
            "id": job_label(job), "job_id": job.job_id, "cluster": job.cluster,
            "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "het_job_id": job.het_job_id, "het_job_offset": job.het_job_offset,
            "user": job.user, "account": job.account, "partition": job.partition,
            "state": job.state, "state_text": state_text(job), "exit_code": job.exit_code,
            "signal": job.signal,
            "nodes": nodes, "gpu_count": fig.gpu_count or job.gpu_count,
            "gpu_model": ", ".join(models) if models else job.gpu_type,
            "start_time": iso(job.start_time), "end_time": iso(job.end_time),
            "elapsed_s": _num(fig.elapsed_s, 3),
            "backend": job.backend, "reason": job.reason,
        },
        "figures": _figures(fig),
        "waste": _waste(fig.waste, fig.hours),
        "verdicts": [{"name": v.name, "title": v.title, "severity": v.severity, "why": v.why,
                      "advice": list(v.advice), "gpus": [{"node": n, "index": i} for n, i in v.gpus]}
                     for v in diag.verdicts],
        "not_assessed": [{"name": s.name, "title": s.title, "reason": s.reason} for s in diag.skipped],
        "gpus": [_gpu(g) for g in fig.gpus],
    }


def document(items: Sequence[tuple[Job, JobFigures, Diagnosis]]) -> dict[str, Any]:
    """The whole ``--json`` output: always a ``jobs`` list, even for one job, so the shape never varies."""
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "jobs": [job_document(j, f, d) for j, f, d in items]}


def dumps(items: Sequence[tuple[Job, JobFigures, Diagnosis]]) -> str:
    return json.dumps(document(items), indent=2, allow_nan=False)
