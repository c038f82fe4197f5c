"""The machine-readable job document (``seff-gpu --json``; docs/user-guide.md, "JSON output"). Stable: fields are only
ever added. Fractions are in [0, 1], times ISO 8601 UTC; an unmeasured value is null with its reason in
``missing`` (on a figure with a value, ``missing`` means it was measured on some GPUs only).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..analysis.diagnose import Diagnosis
from ..analysis.figures import MEANS, GpuFigures, JobFigures, Waste
from ..fmt import iso, job_label, number
from ..readmodel import JobRow, Points
from .text import Runs, Timelines, final_state, is_live, state_text, state_word

SCHEMA = "slurm-gpueff/seff-gpu"
SCHEMA_VERSION = 1


def _waste(w: Waste, hours: float | None) -> dict[str, Any]:
    return {"gpu_hours": number(hours), "idle_gpu_hours": number(w.idle_h),
            "underfilled_gpu_hours": number(w.underfilled_h), "sm_active_gpu_hours": number(w.sm_active_h),
            "reason": w.reason}


def _figures(fig: JobFigures) -> dict[str, Any]:
    m, src = fig.missing, fig.sources
    values = {"gpu_hours": number(fig.hours), **{name: number(fig.mean(name)) for name in MEANS},
              "efficiency": number(fig.efficiency)}
    out: dict[str, Any] = {name: {"value": value, "source": src.get(name, "none"), "missing": m.get(name)}
                           for name, value in values.items()}
    mem_src, mem_missing = src.get("memory", "none"), m.get("memory")
    for name, size in (("memory_used_peak_bytes", fig.memory_used_peak_bytes),
                       ("memory_total_bytes", fig.memory_total_bytes)):
        out[name] = {"value": size, "source": mem_src, "missing": mem_missing if size is None else None}
    out["memory_fraction"] = {"value": number(fig.memory_fraction), "source": mem_src, "missing": mem_missing}
    for name, value in (("energy_j", fig.energy_j), ("power_mean_w", fig.power_mean_w)):
        out[name] = {"value": number(value, 1), "source": src.get(name, "none"), "missing": m.get(name)}
    return out


def series(points: Points | None) -> dict[str, list[Any]] | None:
    """A GPU's coarse timeline as columns (seconds since the job's start; kernel, SM, tensor activity, null
    where unknown), for plotting without reshaping; None when there is none (not recorded, or deleted by
    retention)."""
    pts = [p for p in points or () if p and p[0] is not None]
    if not pts:
        return None

    def column(i: int) -> list[float | None]:
        return [number(p[i]) if len(p) > i and p[i] is not None else None for p in pts]

    return {"t_s": [number(p[0], 1) for p in pts], "kernel_active": column(1), "sm_active": column(2),
            "tensor_active": column(3)}


def _gpu(g: GpuFigures, timelines: Timelines) -> dict[str, Any]:
    return {"node": g.node, "index": g.index, "uuid": g.uuid, "model": g.model, "source": g.source,
            "samples": g.samples, "gpu_hours": number(g.hours), **{name: number(g.mean(name)) for name in MEANS},
            "efficiency": number(g.efficiency), "memory_used_peak_bytes": g.memory_used_peak_bytes,
            "memory_total_bytes": g.memory_total_bytes, "energy_j": number(g.energy_j, 1),
            "power_mean_w": number(g.power_mean_w, 1), "waste": _waste(g.waste, g.hours),
            "window_s": number(g.window_s, 3), "measured_s": number(g.measured_s, 3), "coverage": g.coverage_note,
            "missing": dict(sorted(g.missing.items())), "series": series(timelines.get((g.node, g.index)))} | (
                {"shards": g.shards, "shard_count": g.shard_count} if g.shards else {}) | (  # held whole: as before
                {"shared": {**g.shared.as_json(), "share": number(g.share),
                            "own": {m: number(v) for m, v in (g.own or {}).items()}}} if g.shared else {})


def _run(job: JobRow, fig: JobFigures) -> dict[str, Any]:
    return {"run": job.run, "sluid": job.sluid, "state": final_state(job), "start_time": iso(job.start_time),
            "end_time": iso(job.end_time), "gpu_hours": number(fig.hours), "missing": fig.missing.get("gpu_hours")}


def job_document(job: JobRow, fig: JobFigures, diag: Diagnosis, runs: Runs = (),
                 timelines: Timelines | None = None, accounting: bool = True) -> dict[str, Any]:
    """One job's document (an element of ``jobs``). For a requeued job the figures are its last run's, and
    ``runs`` lists every run (``run`` < 0: not settled by accounting yet; docs/DESIGN.md, "Runs"); a job
    never requeued has no ``runs``. ``timelines`` give each GPU's ``series`` (null without one). ``accounting``
    false: the site keeps no Slurm accounting, so what the Epilog saw is final (``state_pending`` false,
    ``state_text`` says so)."""
    nodes = list(dict.fromkeys(g.node for g in fig.gpus)) or ([job.nodelist] if job.nodelist else [])
    models = list(dict.fromkeys(g.model for g in fig.gpus if g.model))
    return {
        "job": {
            "id": job_label(job), "job_id": job.job_id, "cluster": job.cluster,
            "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
            "het_job_id": job.het_job_id, "het_job_offset": job.het_job_offset,
            "user": job.user, "account": job.account, "partition": job.partition,
            "state": state_word(job),
            "state_pending": accounting and not job.enriched and not is_live(job),
            "running": is_live(job), "as_of": iso(job.end_time) if is_live(job) else None,
            "state_text": state_text(job, accounting), "exit_code": job.exit_code,
            "signal": job.signal,
            "nodes": nodes, "gpu_count": fig.gpu_count or job.gpu_count,
            "gpu_model": ", ".join(models) if models else job.gpu_type,
            "start_time": iso(job.start_time), "end_time": iso(job.end_time),
            "elapsed_s": number(fig.elapsed_s, 3),
            "backend": job.backend, "reason": job.reason,
            "measured_s": number(fig.measured_s, 3), "coverage": fig.coverage_note,
        },
        "figures": _figures(fig),
        "cpu": {"alloc_cpus": fig.cpu.alloc_cpus, "total_cpu_s": number(fig.cpu.total_cpu_s, 3),
                "efficiency": number(fig.cpu.efficiency), "max_rss_bytes": fig.cpu.max_rss_bytes,
                "missing": dict(sorted(fig.cpu.missing.items()))},
        "waste": _waste(fig.waste, fig.hours),
        "verdicts": [{"name": v.name, "title": v.title, "severity": v.severity, "why": v.why,
                      "advice": list(v.advice), "gpus": [{"node": n, "index": i} for n, i in v.gpus]}
                     for v in diag.verdicts],
        "not_assessed": [{"name": s.name, "title": s.title, "reason": s.reason} for s in diag.skipped],
        "gpus": [_gpu(g, timelines or {}) for g in fig.gpus],
    } | ({"runs": [_run(j, f) for j, f in runs]} if len(runs) > 1 else {})


def dumps(items: Sequence[tuple[JobRow, JobFigures, Diagnosis]], runs: Sequence[Runs] = (),
          timelines: Sequence[Timelines] = (), accounting: bool = True) -> str:
    """The whole ``--json`` output: always a ``jobs`` list, even for one job, so the shape never varies;
    ``runs`` and ``timelines``: each item's (as :func:`job_document`), when given."""
    runs = runs or [()] * len(items)
    tls: Sequence[Timelines] = timelines or [{}] * len(items)
    doc = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
           "jobs": [job_document(j, f, d, r, t, accounting) for (j, f, d), r, t in zip(items, runs, tls, strict=True)]}
    return json.dumps(doc, indent=2, allow_nan=False)
