"""A reportseff-style table of many jobs from their stored summaries, with totals; and its JSON.

Totals weight each percentage by GPU-hours over the jobs where it was measured; an unmeasured figure
reads ``n/a`` (``null`` in JSON), never 0. A requeued job's runs are lines of their own (``(run 1)``; ``(run
?)`` until accounting settles it), its GPU-hours all in the total, the job counted once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..analysis.cpu import cpu_figures
from ..fmt import gpu_hours, hms, iso, job_label, number, pct, plural
from ..readmodel import JobRow
from .text import state_word

SCHEMA = "slurm-gpueff/seff-gpu-jobs"
VERSION = 1


def _waste(job: JobRow) -> float | None:
    if job.idle_gpu_hours is None or job.underfilled_gpu_hours is None:
        return None
    return float(job.idle_gpu_hours + job.underfilled_gpu_hours)


def _cpu(job: JobRow) -> float | None:
    """CPU efficiency (TotalCPU / (Elapsed x CPUs), analysis/cpu.py), None where accounting did not say."""
    return cpu_figures(job, job.elapsed_s).efficiency


def _label(job: JobRow) -> str:
    return job_label(job) + (f" (run {job.run})" if job.run > 0 else " (run ?)" if job.run < 0 else "")


def totals(jobs: Sequence[JobRow]) -> dict[str, Any]:
    """Sums and GPU-hour-weighted means over the jobs (each over the jobs where it was measured); a table cut
    to its newest lines gets the same figures over all its jobs from the database
    (storage.summaries.table_totals)."""
    def wmean(getter: Callable[[JobRow], float | None]) -> float | None:
        num = den = 0.0
        for j in jobs:
            v = getter(j)
            if v is not None and j.gpu_hours:
                num += v
                den += j.gpu_hours
        return num / den if den else None

    cpu = [(j.total_cpu_s, j.elapsed_s * j.alloc_cpus) for j in jobs
           if _cpu(j) is not None and j.total_cpu_s is not None and j.elapsed_s is not None and j.alloc_cpus]
    hours = [j.gpu_hours for j in jobs if j.gpu_hours is not None]
    wastes = [w for w in map(_waste, jobs) if w is not None]
    return {
        "rows": len(jobs),
        "gpus": sum(j.gpu_count for j in jobs),
        "jobs": len({(j.cluster, j.job_id) for j in jobs}),
        "gpu_hours": sum(hours) if hours else None,
        "kernel_active": wmean(lambda j: None if j.idle_gpu_hours is None or j.gpu_hours is None
                               else j.gpu_hours - j.idle_gpu_hours),
        "sm_active": wmean(lambda j: j.sm_active_gpu_hours),
        "tensor_active": wmean(lambda j: j.tensor_active_gpu_hours),
        "cpu_efficiency": min(1.0, sum(c for c, _ in cpu) / sum(a for _, a in cpu)) if cpu else None,
        "waste_gpu_hours": sum(wastes) if wastes else None,
        "energy_j": sum(e) if (e := [j.energy_j for j in jobs if j.energy_j is not None]) else None,
    }


def render(jobs: Sequence[JobRow], total: dict[str, Any] | None = None) -> str:
    """The table's lines and its totals line (``total``: over more jobs than the lines, else over them)."""
    head = ("JobID", "State", "Elapsed", "GPUs", "GPU-h", "Kernel%", "SM%", "Tensor%", "CPU%", "WasteGPU-h",
            "Verdict")
    rows = []
    for j in jobs:
        verdict = j.verdict_title or j.verdict or ("(pending analysis)" if j.analyzed_at is None else "-")
        rows.append((_label(j), state_word(j), hms(j.elapsed_s), str(j.gpu_count),
                     gpu_hours(j.gpu_hours), pct(j.kernel_active), pct(j.sm_active), pct(j.tensor_active),
                     pct(_cpu(j)), gpu_hours(_waste(j)), verdict))
    t = total if total is not None else totals(jobs)
    foot = (f"Total ({plural(t['jobs'], 'job')})", "", "", str(t["gpus"]),
            gpu_hours(t["gpu_hours"]), pct(t["kernel_active"]), pct(t["sm_active"]), pct(t["tensor_active"]),
            pct(t["cpu_efficiency"]), gpu_hours(t["waste_gpu_hours"]), "")
    widths = [max(len(r[i]) for r in (head, *rows, foot)) for i in range(len(head))]
    right = {3, 4, 5, 6, 7, 8, 9}

    def line(r: Sequence[str]) -> str:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        return "  ".join(cells).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(head), sep, *map(line, rows), sep, line(foot)])


# How many decimals a figure keeps in JSON: as the one-job document's (render/json.py), through fmt.number.
_SECONDS = ("elapsed_s", "total_cpu_s")
_JOULES = ("energy_j",)
_EXACT = ("gpus", "rows", "jobs", "alloc_cpus", "max_rss_bytes")


def _rounded(figures: dict[str, Any]) -> dict[str, Any]:
    """The figures among ``figures`` (floats) rounded as :func:`slurm_gpueff.fmt.number` does for --json."""
    return {k: number(v, 3 if k in _SECONDS else 1 if k in _JOULES else 6)
            if isinstance(v, float) and k not in _EXACT else v for k, v in figures.items()}


def as_json(jobs: Sequence[JobRow], query: dict[str, Any], total: dict[str, Any] | None = None) -> dict[str, Any]:
    """The table as JSON; ``totals.rows`` says how many lines there are in all when ``jobs`` are the newest.
    Figures are rounded as in the one-job document, totals too."""
    out = [_rounded({
        "job_id": job_label(j), "raw_job_id": j.job_id, "run": j.run, "cluster": j.cluster, "user": j.user,
        "account": j.account, "state": state_word(j), "end_time": iso(j.end_time),
        "elapsed_s": j.elapsed_s, "gpus": j.gpu_count, "gpu_hours": j.gpu_hours,
        "kernel_active": j.kernel_active, "sm_active": j.sm_active, "tensor_active": j.tensor_active,
        "cpu_efficiency": _cpu(j), "alloc_cpus": j.alloc_cpus, "total_cpu_s": j.total_cpu_s,
        "max_rss_bytes": j.max_rss_bytes, "idle_gpu_hours": j.idle_gpu_hours,
        "underfilled_gpu_hours": j.underfilled_gpu_hours,
        "waste_gpu_hours": _waste(j), "energy_j": j.energy_j, "verdict": j.verdict,
        "verdict_title": j.verdict_title, "analyzed": j.analyzed_at is not None}) for j in jobs]
    return {"schema": SCHEMA, "schema_version": VERSION, "query": query, "jobs": out,
            "totals": _rounded(total if total is not None else totals(jobs))}
