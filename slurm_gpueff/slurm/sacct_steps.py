"""The CPU side of a job from Slurm accounting: allocated CPUs, TotalCPU and MaxRSS, from its step lines.

MaxRSS exists only on steps, and what the allocation line's TotalCPU holds under ``-X`` differs between
versions, so these come from one ``sacct -P`` query *without* ``-X`` whose output is the same on every
Slurm from 22.05 to 26.05 (``--json`` moved these fields three times). TotalCPU is summed over the steps
(``batch``, ``extern``, ``0``...), MaxRSS is the largest of any step, AllocCPUS is the allocation line's.
A field that is empty or unreadable is None (unknown), never 0.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .jobid import is_digits
from .sacct_rows import SacctJob

STEP_FIELDS = ("JobIDRaw", "JobID", "AllocCPUS", "TotalCPU", "MaxRSS")
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTP]?)$")
_DURATION = re.compile(r"^(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)$")
MAX_BYTES = 2**63 - 1


@dataclass
class CpuUse:
    alloc_cpus: int | None = None
    total_cpu_s: float | None = None
    max_rss_bytes: int | None = None


def cpu_seconds(text: str) -> float | None:
    """Seconds from sacct's TotalCPU: ``MM:SS.mmm``, ``HH:MM:SS``, ``D-HH:MM:SS``; None if not one."""
    m = _DURATION.match(text.strip())
    if m is None:
        return None
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + seconds


def size_bytes(text: str) -> int | None:
    """Bytes from sacct's MaxRSS (``123456K``, ``1.50G``; 1024-based); None if empty or not a size."""
    m = _SIZE.match(text.strip().upper())
    if m is None:
        return None
    value = int(float(m.group(1)) * _UNITS[m.group(2)])
    return value if value <= MAX_BYTES else None


def parse_steps(text: str, delimiter: str = "|") -> dict[int, CpuUse]:
    """``{raw job id: CpuUse}`` from ``sacct -P -n --delimiter=D -o JobIDRaw,JobID,AllocCPUS,TotalCPU,MaxRSS``."""
    alloc: dict[int, tuple[int | None, float | None]] = {}
    steps: dict[int, list[tuple[float | None, int | None]]] = {}
    for line in text.splitlines():
        cells = line.split(delimiter)
        if len(cells) != len(STEP_FIELDS):
            continue  # not one of our lines (a warning sacct printed to stdout)
        raw, _shown, cpu_text, total, rss_text = (c.strip() for c in cells)
        head, dot, _step = raw.partition(".")
        if not is_digits(head):
            continue
        job_id = int(head)
        if dot:
            steps.setdefault(job_id, []).append((cpu_seconds(total), size_bytes(rss_text)))
        else:
            alloc[job_id] = (int(cpu_text) if is_digits(cpu_text) and len(cpu_text) < 10 else None, cpu_seconds(total))
    out = {}
    for job_id in alloc.keys() | steps.keys():
        cpus, alloc_total = alloc.get(job_id, (None, None))
        totals = [t for t, _r in steps.get(job_id, []) if t is not None]
        peaks = [r for _t, r in steps.get(job_id, []) if r is not None]
        out[job_id] = CpuUse(alloc_cpus=cpus, total_cpu_s=sum(totals) if totals else alloc_total,
                             max_rss_bytes=max(peaks) if peaks else None)
    return out


def attach(jobs: Iterable[SacctJob], use: dict[int, CpuUse]) -> None:
    """Give each job's latest run its CPU use (sacct without ``-D`` reports the steps of the last run)."""
    latest: dict[int, SacctJob] = {}
    for j in jobs:
        prev = latest.get(j.job_id)
        if prev is None or (j.start or 0.0) >= (prev.start or 0.0):
            latest[j.job_id] = j
    for jid, j in latest.items():
        u = use.get(jid)
        if u is not None:
            j.alloc_cpus, j.total_cpu_s, j.max_rss_bytes = u.alloc_cpus, u.total_cpu_s, u.max_rss_bytes
