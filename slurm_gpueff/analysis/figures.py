"""The job's figures: GPU-hours, activity means, the waste split, memory and energy.

Every definition, and how a job combines its GPUs, is in docs/DESIGN.md ("Figures"). Nothing is invented:
a figure that was not measured is ``None`` and its reason is kept (from the GPU row's ``missing``, or derived
here). It reads the read model's rows (readmodel.py), stored or not, so the analysis runs without a database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ..readmodel import GpuRow, JobRow, Shared
from .coverage import describe
from .cpu import CpuFigures, cpu_figures

# Figures averaged over time (fractions in [0, 1]) and what we call them in reasons.
MEANS = ("kernel_active", "sm_active", "tensor_active", "dram_active", "sm_occupancy",
         "fp32_active", "fp16_active", "fp64_active", "hmma_active", "imma_active", "dfma_active")
LABELS = {
    "kernel_active": "kernel activity", "sm_active": "SM activity", "tensor_active": "tensor activity",
    "dram_active": "DRAM activity", "sm_occupancy": "SM occupancy", "fp32_active": "FP32 activity",
    "fp16_active": "FP16 activity", "fp64_active": "FP64 activity", "memory_fraction": "peak memory share",
    "hmma_active": "floating-point tensor (HMMA: FP16/BF16/TF32/FP8) activity",
    "imma_active": "integer tensor (IMMA) activity",
    "dfma_active": "FP64 tensor (DFMA) activity",
}
QUANTITIES = ("memory_used_peak_bytes", "memory_total_bytes", "energy_j", "power_mean_w")  # per GPU, as measured
# The means that are shares of time (a shared GPU's job part of them is its own); SM occupancy is not one.
FRACTIONS_OF_TIME = tuple(m for m in MEANS if m != "sm_occupancy")
SHARED_OCCUPANCY = "SM occupancy is the shared GPU's, every job's on it; it has no per-job part"
NOT_MEASURED = "not measured"
NO_GPUS = "job had no GPUs"


@dataclass
class Waste:
    """The split of allocated GPU-hours; each part None (with ``reason``) when it cannot be known."""

    idle_h: float | None = None
    underfilled_h: float | None = None
    sm_active_h: float | None = None
    reason: str | None = None


@dataclass
class GpuFigures:
    """One GPU of the job, over its allocated time."""

    node: str
    index: int
    model: str | None
    uuid: str | None
    source: str
    samples: int
    hours: float | None
    means: dict[str, float | None]
    efficiency: float | None
    memory_used_peak_bytes: int | None
    memory_total_bytes: int | None
    energy_j: float | None
    power_mean_w: float | None
    waste: Waste
    missing: dict[str, str] = field(default_factory=dict)
    window_s: float | None = None  # the seconds from the reading at job start to the one at job end
    measured_s: float | None = None  # the part of it the figures cover, where the backend knows (else None)
    coverage_note: str | None = None  # what of the window is not covered, and why (analysis/coverage.py)
    shards: int | None = None  # a shared GPU (Slurm gres/shard): the shards the job held ...
    shard_count: int | None = None  # ... of the GPU's (None: unknown)
    # Shared with other jobs and measured per job (record.py ``shared``): with whom, how, the job's share; its
    # means are then relative to that share, and ``own`` holds them as fractions of the whole GPU's time.
    shared: Shared | None = None
    own: dict[str, float | None] | None = None
    share: float | None = None  # of the GPU the job held: shards / count, else the measured time share

    @property
    def label(self) -> str:
        return f"{self.node}:{self.index}"

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used_peak_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_peak_bytes / self.memory_total_bytes

    def mean(self, metric: str) -> float | None:
        return self.means.get(metric)


@dataclass
class JobFigures:
    """The whole job: sums and A-weighted means over its GPUs, plus each figure's source and reason."""

    gpus: list[GpuFigures]
    hours: float | None
    elapsed_s: float | None
    means: dict[str, float | None]
    coverage: dict[str, int]
    efficiency: float | None
    waste: Waste
    memory_used_peak_bytes: int | None
    memory_total_bytes: int | None
    memory_fraction: float | None
    energy_j: float | None
    power_mean_w: float | None
    sources: dict[str, str]
    missing: dict[str, str]
    measured_s: float | None = None  # the shortest measured window of its GPUs (their allocated time if unknown)
    coverage_note: str | None = None
    cpu: CpuFigures = field(default_factory=CpuFigures)  # the CPU side, from Slurm accounting

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def mean(self, metric: str) -> float | None:
        return self.means.get(metric)

    @property
    def backends(self) -> list[str]:
        """Distinct GPU sources, in GPU order (``["simulated"]``, ``["nvml-gpm", "none"]``)."""
        return list(dict.fromkeys(g.source for g in self.gpus))


def naive_utc(dt: datetime | None) -> datetime | None:
    """UTC without tzinfo: the DB may hand back aware or naive UTC depending on the SQLModel version."""
    if dt is None or dt.tzinfo is None:
        return dt
    return dt.astimezone(UTC).replace(tzinfo=None)


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (naive_utc(end) - naive_utc(start)).total_seconds())  # type: ignore[operator]


def job_elapsed_s(job: JobRow) -> float | None:
    """Wall time of the job: ``elapsed_s`` (sacct) if known, else end - start."""
    if job.elapsed_s is not None:
        return max(0.0, float(job.elapsed_s))
    return _seconds(job.start_time, job.end_time)


def gpu_figures(job: JobRow, gpu: GpuRow) -> GpuFigures:
    """Figures of one GPU; its T is the GPU's own window, else the job's."""
    missing = dict(gpu.missing)
    t = _seconds(gpu.start_time, gpu.end_time)
    if t is None:
        t = job_elapsed_s(job)
    hours = t / 3600.0 if t is not None else None
    if hours is None:
        missing.setdefault("gpu_hours", "job start/end time unknown")
    raw: dict[str, Any] = {name: getattr(gpu, name) for name in (*MEANS, *QUANTITIES)}
    shards, count, shared = gpu.shards, gpu.shard_count, gpu.shared
    slurm_share = min(1.0, shards / count) if shards and count else None
    own: dict[str, float | None] | None = None
    share: float | None = slurm_share
    if shared is not None:
        hours, raw, own, share = _measured_share(hours, raw, slurm_share, shared, missing)
    elif shards:
        hours, raw = _shared(hours, raw, shards, count, missing)
    for name, v in raw.items():
        if v is None:
            missing[name] = missing.get(name) or NOT_MEASURED
    means = {m: None if raw[m] is None else min(1.0, max(0.0, float(raw[m]))) for m in MEANS}
    k, s = means["kernel_active"], means["sm_active"]
    window_s, measured = gpu.window_s, gpu.measured_s
    return GpuFigures(node=gpu.node, index=gpu.gpu_index, model=gpu.model, uuid=gpu.uuid,
                      source=gpu.source or "none", samples=gpu.samples or 0, hours=hours, means=means,
                      efficiency=_efficiency(k, s, missing), waste=split(hours, k, s, missing), missing=missing,
                      window_s=window_s, measured_s=measured,
                      coverage_note=describe(gpu.window, window_s, measured),
                      shards=shards, shard_count=count, shared=shared, own=own, share=share,
                      **{q: raw[q] for q in QUANTITIES})


def _shared(hours: float | None, raw: dict[str, Any], shards: int, count: int | None,
            missing: dict[str, str]) -> tuple[float | None, dict[str, Any]]:
    """A GPU the job held ``shards`` of ``count`` shards of: its share of the GPU-hours, so that a GPU's hours
    are counted once across the jobs sharing it. What the GPU measured is the whole device's, every job's on
    it: never shown as this job's own (its own share of the activity needs per-process attribution)."""
    if count:
        hours = hours * min(1.0, shards / count) if hours is not None else None
    else:
        hours = None
        missing["gpu_hours"] = missing.get("shards") or "the shared GPU's shard count is unknown"
    whose = f"the shared GPU's as a whole ({shards} of its {count or '?'} shards were this job's), not this job's own"
    out = dict(raw)
    for name in (*MEANS, "memory_used_peak_bytes", "energy_j", "power_mean_w"):
        if out[name] is not None:
            out[name] = None
            missing[name] = whose
    return hours, out


def _measured_share(hours: float | None, raw: dict[str, Any], slurm_share: float | None, shared: Shared,
                    missing: dict[str, str]
                    ) -> tuple[float | None, dict[str, Any], dict[str, float | None], float | None]:
    """A GPU shared with other jobs whose own part the node agent measured (its figures are fractions of the
    whole GPU's time that were this job's, node/attribution.py). Its GPU-hours are its share of the GPU's:
    Slurm's shards where accounting gives them, else the measured time share (1/n while n jobs held it), so
    a GPU's hours are counted once across its jobs. Its means become relative to that share (40 % of the
    GPU's time at a half share reads 80 %), capped at 100 %: a job that used more than its share took time
    its neighbours left idle, and it is not charged idle time for it. ``own`` keeps the whole-GPU fractions."""
    measured = shared.share
    share = slurm_share if slurm_share is not None else (float(measured) if measured is not None and measured > 0
                                                         else None)
    own = {m: raw[m] for m in MEANS}
    out = dict(raw)
    if share is None:
        hours = None
        missing["gpu_hours"] = missing.get("shards") or "the job's share of the shared GPU is unknown"
        return hours, out, own, share
    hours = hours * share if hours is not None else None
    for m in MEANS:
        if out[m] is None:
            continue
        if m in FRACTIONS_OF_TIME:
            out[m] = min(1.0, float(out[m]) / share)
        else:
            out[m] = own[m] = None
            missing[m] = SHARED_OCCUPANCY
    return hours, out, own, share


def split(hours: float | None, k: float | None, s: float | None, missing: dict[str, str]) -> Waste:
    """The waste split of one GPU: unknown without ``k``; only the idle part without ``s``."""
    if hours is None:
        return Waste(reason=missing.get("gpu_hours", "allocated time unknown"))
    if k is None:
        return Waste(reason=_not_measured("kernel activity", missing, "kernel_active"))
    idle = hours * (1.0 - k)
    if s is None:
        return Waste(idle_h=idle, reason=_not_measured("SM activity", missing, "sm_active"))
    active = min(s, k)
    return Waste(idle_h=idle, underfilled_h=hours * (k - active), sm_active_h=hours * active)


def _efficiency(k: float | None, s: float | None, missing: dict[str, str]) -> float | None:
    """``s / k`` capped at 1; None (its reason put in ``missing``) when ``k`` is 0 or either is unknown."""
    if k is not None and s is not None and k > 0:
        return min(1.0, s / k)
    missing["efficiency"] = ("no kernel ever ran" if k == 0 else
                             missing.get("sm_active") or missing.get("kernel_active") or NOT_MEASURED)
    return None


def _not_measured(label: str, missing: dict[str, str], metric: str) -> str:
    why = missing.get(metric) or NOT_MEASURED
    return f"{label} {why}" if why == NOT_MEASURED else f"{label} not measured: {why}"


def _weights(gpus: Sequence[GpuFigures]) -> list[float]:
    """Each GPU's A; equal weights where some A is unknown or all are zero (a 0-second job)."""
    hs = [g.hours for g in gpus]
    if any(h is None for h in hs) or sum(hs) <= 0:  # type: ignore[arg-type]
        return [1.0] * len(gpus)
    return [float(h) for h in hs]  # type: ignore[arg-type]


def _sum(values: Iterable[float | None]) -> float | None:
    vals = list(values)
    if not vals or any(v is None for v in vals):
        return None
    return float(sum(vals))  # type: ignore[arg-type]


def _reasons(gpus: Sequence[GpuFigures], metric: str) -> str:
    """Every distinct reason the GPUs give for a missing figure."""
    if not gpus:
        return NO_GPUS
    return "; ".join(dict.fromkeys(r for g in gpus if (r := g.missing.get(metric)))) or NOT_MEASURED


def _partial(gpus: Sequence[GpuFigures], metric: str, have: int) -> str:
    return f"{_reasons(gpus, metric)} on {len(gpus) - have} of {len(gpus)} GPUs"


def _source(gpus: Sequence[GpuFigures], ok: Sequence[bool]) -> str:
    return "+".join(dict.fromkeys(g.source for g, present in zip(gpus, ok, strict=True) if present)) or "none"


def job_figures(job: JobRow, gpus: Sequence[GpuRow], accounting: bool = True) -> JobFigures:
    """All figures of a job from its rows (read model, stored or not); ``accounting``: whether the site
    keeps Slurm accounting (``[sacct] accounting``), where the CPU side comes from."""
    per = [gpu_figures(job, g) for g in sorted(gpus, key=lambda g: (g.node, g.gpu_index))]
    fig = combine(per, job_elapsed_s(job))
    fig.cpu = cpu_figures(job, fig.elapsed_s, accounting)
    return fig


def combine(per: list[GpuFigures], elapsed_s: float | None = None) -> JobFigures:
    """Job-level figures from per-GPU figures: sums are None unless every GPU has them (DESIGN.md)."""
    weights = _weights(per)
    means: dict[str, float | None] = {}
    coverage: dict[str, int] = {}
    sources: dict[str, str] = {}
    missing: dict[str, str] = {}
    for m in MEANS:
        pairs = [(v, w) for g, w in zip(per, weights, strict=True) if (v := g.means[m]) is not None]
        coverage[m] = len(pairs)
        sources[m] = _source(per, [g.means[m] is not None for g in per])
        if not pairs:
            means[m] = None
            missing[m] = _reasons(per, m)
            continue
        wsum = sum(w for _, w in pairs)
        means[m] = sum(v * w for v, w in pairs) / wsum if wsum > 0 else sum(v for v, _ in pairs) / len(pairs)
        if len(pairs) < len(per):
            missing[m] = _partial(per, m, len(pairs))
    hours = _sum(g.hours for g in per)
    if hours is None:
        missing["gpu_hours"] = _reasons(per, "gpu_hours")
    sources["gpu_hours"] = "slurm"
    efficiency = _efficiency(means["kernel_active"], means["sm_active"], missing)
    sources["efficiency"] = sources["sm_active"] if efficiency is not None else "none"
    waste = Waste(idle_h=_sum(g.waste.idle_h for g in per), underfilled_h=_sum(g.waste.underfilled_h for g in per),
                  sm_active_h=_sum(g.waste.sm_active_h for g in per))
    if waste.sm_active_h is None:
        lacking = [g for g in per if g.waste.reason]
        distinct = list(dict.fromkeys(str(g.waste.reason) for g in lacking))
        if len(distinct) == 1 and len(lacking) == len(per):
            waste.reason = distinct[0]  # the same on every GPU: say it once
        else:
            waste.reason = "; ".join(f"{g.label}: {g.waste.reason}" for g in lacking) or NO_GPUS
    energy = _sum(g.energy_j for g in per)
    sources["energy_j"] = _source(per, [g.energy_j is not None for g in per])
    if energy is None:
        missing["energy_j"] = _reasons(per, "energy_j")
    powers = [(g.power_mean_w, w) for g, w in zip(per, weights, strict=True) if g.power_mean_w is not None]
    power_weight = sum(w for _, w in powers)
    power = sum(p * w for p, w in powers) / power_weight if power_weight > 0 else None
    sources["power_mean_w"] = _source(per, [g.power_mean_w is not None for g in per])
    if power is None:
        missing["power_mean_w"] = _reasons(per, "power_mean_w")
    elif len(powers) < len(per):
        missing["power_mean_w"] = _partial(per, "power_mean_w", len(powers))
    # Memory: the GPU with the largest peak share (or largest peak where totals are unknown).
    mem_used = mem_total = mem_frac = None
    with_frac = [g for g in per if g.memory_fraction is not None]
    if with_frac:
        worst = max(with_frac, key=lambda g: g.memory_fraction or 0.0)
        mem_used, mem_total, mem_frac = worst.memory_used_peak_bytes, worst.memory_total_bytes, worst.memory_fraction
        sources["memory"] = _source(per, [g.memory_fraction is not None for g in per])
        if len(with_frac) < len(per):
            missing["memory"] = _partial(per, "memory_used_peak_bytes", len(with_frac))
    else:
        mem_used = max((g.memory_used_peak_bytes for g in per if g.memory_used_peak_bytes is not None), default=None)
        mem_total = max((g.memory_total_bytes for g in per if g.memory_total_bytes), default=None)
        sources["memory"] = _source(per, [g.memory_used_peak_bytes is not None for g in per])
        missing["memory"] = _reasons(per, "memory_used_peak_bytes" if mem_used is None else "memory_total_bytes")
    measured = [sec for g in per
                if (sec := g.measured_s if g.measured_s is not None else g.hours * 3600.0 if g.hours else None)
                is not None]
    notes = list(dict.fromkeys(n for g in per if (n := g.coverage_note)))
    return JobFigures(gpus=per, hours=hours, elapsed_s=elapsed_s, means=means, coverage=coverage,
                      efficiency=efficiency, waste=waste, memory_used_peak_bytes=mem_used,
                      memory_total_bytes=mem_total, memory_fraction=mem_frac, energy_j=energy,
                      power_mean_w=power, sources=sources, missing=missing, measured_s=min(measured, default=None),
                      coverage_note=(notes[0] if len(notes) == 1 else "; ".join(
                          f"{g.label}: {g.coverage_note}" for g in per if g.coverage_note)) or None)

