"""A GPU's readings split among the jobs that hold it, by their processes: each job's own share.

Slurm lets several jobs hold one GPU (``gres/shard``, MPS, ``OverSubscribe``), and NVML's and GPM's figures
are the whole device's. Between two of the agent's readings, the GPU's integrals grew by a known amount
(activity x seconds, energy); this module says which part of that growth was which job's:

- The *activity* share of a job is its processes' part of NVML's per-process SM-utilization samples taken
  in that interval (``nvmlDeviceGetProcessUtilization``, the time each process had kernels on the GPU).
  Every activity figure of the interval (kernel, SM, tensor, DRAM, pipes) is split by it: per-process GPM
  does not exist, so a job's SM activity is the device's SM activity over the time its kernels ran.
- A process that cannot be mapped to a running job (another user's stray process, a process gone before it
  was looked at) has its part counted as *unattributed*, never given to a job; activity in an interval
  with no per-process sample at all is unattributed as well.
- *Energy* follows the activity share; in an interval where nothing ran, the idle power is the price of
  holding the GPU and is split evenly among the jobs holding it.
- *Memory* is each job's processes' own used memory (``nvmlDeviceGetComputeRunningProcesses``).
- Under *MPS*, NVML lists each client process with its own memory, but credits every client's kernels to
  the MPS server process (measured on an H100, docs/gpu-validation): no job's part of the activity or energy
  can be measured then. Such an interval is *unmeasured* for every job holding the GPU (its seconds are not
  covered, so a job's figures are over the intervals that were measured, or n/a with the reason), never
  given to one job and never counted as the jobs' idle time.
- The *allocation* share (for GPU-hours when Slurm's shards do not say) is 1/n of the time n jobs held it.

A GPU held by one job is not split at all: the job gets the whole interval, as before, and no process is
looked at. Pure functions and small state; the agent calls them each reading (:mod:`.agent`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..record import MAX_WITH
from . import integrals, resume
from .nvml_sampler import ProcSample
from .proc_jobs import Owner

UNATTRIBUTED = "unattributed"
MPS_UNMEASURED = ("the GPU ran MPS clients: NVML credits all their kernels to the MPS server, so this job's own "
                  "part cannot be measured")


@dataclass
class Split:
    """Who gets what of one interval: ``activity`` and ``energy`` shares (job id or UNATTRIBUTED -> share; each
    sums to 1 when anything is split), each job's processes' memory, how each mapped job's processes were
    found, and why a process went unattributed."""

    activity: dict[str, float]
    energy: dict[str, float]
    memory: dict[str, int]
    how: dict[str, str]
    unmapped: dict[int, str]
    unmeasured: str | None = None  # why no job's part of this interval can be known (MPS), else None


def split(holders: list[str], procs: ProcSample | None, owner: Callable[[int], Owner]) -> Split:
    """The interval's split among ``holders`` (the jobs whose Prolog named this GPU). One holder gets everything
    and ``procs`` is not looked at; for several, ``procs`` None (the processes could not be read) is a GPU with
    no process seen: its activity unattributed, its energy even among the holders."""
    if len(holders) == 1:
        return Split({holders[0]: 1.0}, {holders[0]: 1.0}, {}, {}, {})
    sm = procs.sm if procs is not None else {}
    used_by = procs.memory if procs is not None else {}
    weights: dict[str, float] = {}
    memory: dict[str, int] = {}
    how: dict[str, str] = {}
    unmapped: dict[int, str] = {}
    mps = False
    for pid in sorted(set(sm) | set(used_by)):
        o = owner(pid)
        mps = mps or (o.mps_server and (sm.get(pid) or 0.0) > 0)
        who = o.job if o.job is not None and o.job in holders else UNATTRIBUTED
        if who == UNATTRIBUTED:
            unmapped[pid] = o.how if o.job is None else f"Slurm job {o.job} does not hold this GPU"
        else:
            how[who] = o.how
        w = sm.get(pid, 0.0)
        if w > 0 and math.isfinite(w):
            weights[who] = weights.get(who, 0.0) + w
        used = used_by.get(pid)
        if used is not None and who != UNATTRIBUTED:
            memory[who] = memory.get(who, 0) + used
    if mps:
        return Split({}, {}, memory, how, unmapped, unmeasured=MPS_UNMEASURED)
    total = sum(weights.values())
    if total > 0:
        shares = {who: w / total for who, w in weights.items()}
        return Split(shares, dict(shares), memory, how, unmapped)
    # nothing any process reported: what the device measured belongs to no known job; holding it cost energy
    return Split({UNATTRIBUTED: 1.0}, {j: 1.0 / len(holders) for j in holders}, memory, how, unmapped)


class JobShare:
    """One job's part of one GPU, cumulative from when the agent first saw the job hold it: the attributed
    integrals (``counters``: share x value x seconds; covered seconds as the device's), attributed energy,
    the seconds held (``tracked_s``), held per holder (``held_s``: Σ dt/n) and held with others
    (``shared_s``), the other jobs seen, its processes' peak memory and how they were mapped."""

    def __init__(self) -> None:
        self.counters = integrals.new_counters()
        self.energy_mj = 0.0
        self.tracked_s = 0.0
        self.held_s = 0.0
        self.shared_s = 0.0
        self.others: set[str] = set()
        self.memory_peak: int | None = None
        self.how: set[str] = set()
        self.unmeasured_s = 0.0
        self.unmeasured_why: str | None = None

    def published(self) -> dict[str, Any]:
        return {**integrals.published(self.counters, integrals.METRICS), "energy_mj": _r(self.energy_mj),
                "tracked_s": _r(self.tracked_s), "held_s": _r(self.held_s), "shared_s": _r(self.shared_s),
                "with": sorted(self.others)[:MAX_WITH], "with_count": len(self.others),
                "memory_peak_bytes": self.memory_peak, "how": sorted(self.how),
                "unmeasured_s": _r(self.unmeasured_s), "unmeasured_why": self.unmeasured_why}

    @classmethod
    def resumed(cls, prev: object) -> JobShare | None:
        """An earlier agent's published share, or None when it is not one."""
        if not isinstance(prev, dict):
            return None
        counters = resume.counters_of(prev, integrals.METRICS)
        nums = [prev.get(k) for k in ("energy_mj", "tracked_s", "held_s", "shared_s")]
        if counters is None or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in nums):
            return None
        js = cls()
        js.counters = counters  # type: ignore[assignment]  # the Counters shape, checked by counters_of
        js.energy_mj, js.tracked_s, js.held_s, js.shared_s = (float(v) for v in nums)  # type: ignore[arg-type]
        js.others = {str(j) for j in prev.get("with") or [] if isinstance(j, str)}
        peak = prev.get("memory_peak_bytes")
        js.memory_peak = peak if isinstance(peak, int) and not isinstance(peak, bool) else None
        js.how = {str(h) for h in prev.get("how") or [] if isinstance(h, str)}
        un = prev.get("unmeasured_s")
        js.unmeasured_s = float(un) if isinstance(un, int | float) and not isinstance(un, bool) else 0.0
        why = prev.get("unmeasured_why")
        js.unmeasured_why = why if isinstance(why, str) else None
        return js


def delta(now: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The growth of a GPU's counters (``sum``, ``covered_s``, ``count``) since ``base``."""
    return {part: {m: float(now[part][m]) - float(base[part][m]) for m in integrals.METRICS}
            for part in ("sum", "covered_s", "count")}


def add(share: JobShare | integrals.Counters, d: Mapping[str, Mapping[str, float]], activity: float,
        power_share: float) -> None:
    """Add ``d``, one interval's growth of the GPU's counters, to a job's (or the unattributed) counters: the
    activities by ``activity``, mean power by ``power_share``; covered seconds and counts whole."""
    c = share.counters if isinstance(share, JobShare) else share
    for m in integrals.METRICS:
        f = power_share if m == "power_w" else activity
        c["sum"][m] += d["sum"][m] * f
        c["covered_s"][m] += d["covered_s"][m]
        c["count"][m] += int(d["count"][m])


def _r(v: float | None) -> float | None:
    return round(v, 6) if v is not None and math.isfinite(v) else None
