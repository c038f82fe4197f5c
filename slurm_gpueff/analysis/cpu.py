"""The CPU side of a job, from Slurm accounting: CPU efficiency and peak host memory (docs/FIGURES.md).

CPU efficiency is TotalCPU (user + system seconds of all steps) over Elapsed x allocated CPUs, as ``seff``
computes it. It tells apart the two cases of a starved GPU: CPUs saturated (the input pipeline needs more
CPUs or workers) or CPUs idle too (the job waits on I/O, sleeps, something else). Unknown stays None with
the reason: accounting not read yet, or not reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..readmodel import JobRow


@dataclass
class CpuFigures:
    alloc_cpus: int | None = None
    total_cpu_s: float | None = None
    efficiency: float | None = None  # 0-1
    max_rss_bytes: int | None = None
    missing: dict[str, str] = field(default_factory=dict)


# Why the CPU side is not known yet: it comes from Slurm's accounting (TotalCPU, AllocCPUS, MaxRSS), which
# enrichment reads once the job has ended and slurmdbd has it.
PENDING = "Slurm's accounting not read yet"
# Where the site keeps no Slurm accounting ([sacct] accounting = false) nothing will ever be read: the CPU
# side is then never known, and saying "not read yet" would promise what never comes.
NO_ACCOUNTING = "this site keeps no Slurm accounting"


def cpu_figures(job: JobRow, elapsed_s: float | None, accounting: bool = True) -> CpuFigures:
    """From a job row: its CPUs, TotalCPU and MaxRSS as enrichment stored them. ``accounting`` false: the site
    keeps no Slurm accounting, so what is missing is missing for good."""
    pending = not job.enriched
    cpus, total, rss = job.alloc_cpus, job.total_cpu_s, job.max_rss_bytes
    out = CpuFigures(alloc_cpus=cpus, total_cpu_s=total, max_rss_bytes=rss)
    if not accounting:
        pending = False
    if total is None or not cpus:
        out.missing["cpu_efficiency"] = (PENDING if pending else NO_ACCOUNTING if not accounting else
                                         "Slurm's accounting gave no CPU time or no allocated CPUs for it")
    elif not elapsed_s:
        out.missing["cpu_efficiency"] = "elapsed time unknown or zero"
    else:
        out.efficiency = min(1.0, max(0.0, float(total) / (float(elapsed_s) * int(cpus))))
    if rss is None:
        out.missing["max_rss_bytes"] = (PENDING if pending else NO_ACCOUNTING if not accounting else
                                        "Slurm's accounting gave no MaxRSS for it")
    return out
