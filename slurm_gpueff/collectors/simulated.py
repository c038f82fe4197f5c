"""Simulated GPUs: deterministic synthetic figures from named workload profiles, labelled ``simulated``.

For tests, the demo and the Slurm test cluster (fake ``mknod`` GPUs). A job's profile, first match wins:
``GPUEFF_SIM_PROFILE`` in the hook's environment (the demo), a file ``<state_dir>/sim/<job_id>.profile``
(tests under real slurmd, whose job environment does not reach the Prolog), ``simulated.profile``.

Like a real backend, it measures nothing without the Prolog's start state (a node that crashed and rebooted
mid-job, a lost state directory): the job's GPUs are then listed with the reason, never given the figures
of a profile over a window nobody watched.
"""

from __future__ import annotations

import zlib

from .. import statedir
from ..node.gpu_ids import UTIL_REASON, job_slices, parse_legacy_mig
from ..record import FRACTIONS, empty_gpu
from .base import NO_START, Collector, JobContext, Measurement

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..config import Config

GiB = 1024**3

# A profile's figures per GPU, in this order: the record's fractions (kernel, SM, occupancy, tensor, DRAM,
# FP64, FP32, FP16) in [0, 1], peak memory as a fraction of the total, power in W. The tensor work is
# FP16/BF16 (HMMA) unless ``tensor`` names another precision.
_FIELDS = (*FRACTIONS[:8], "mem", "power")
_TENSOR = ("hmma_active", "imma_active", "dfma_active")


def _spec(*values: float, tensor: str = "hmma_active") -> dict[str, float]:
    spec = dict(zip(_FIELDS, values, strict=True))
    return spec | {m: spec["tensor_active"] if m == tensor else 0.0 for m in _TENSOR}


_IDLE = _spec(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.005, 70.0)
_HEALTHY = _spec(0.97, 0.82, 0.35, 0.78, 0.22, 0.0, 0.08, 0.05, 0.85, 610.0)

# "first" is the first allocated GPU, "rest" the others (default: as the first).
PROFILES: dict[str, dict[str, Any]] = {
    "idle": {"describe": "GPU allocated, nothing ever ran on it", "first": _IDLE, "rest": _IDLE},
    "one-sm-spin": {"describe": "one thread block spinning: 100 % 'GPU utilization', 1 of 132 SMs busy",
                    "first": _spec(1.0, 0.0076, 0.0001, 0.0, 0.0, 0.0, 0.0, 0.0, 0.01, 120.0)},
    "tiny-kernels": {"describe": "a Python loop launching tiny kernels: launch-bound",
                     "first": _spec(0.85, 0.02, 0.01, 0.0, 0.01, 0.0, 0.004, 0.0, 0.05, 140.0)},
    "starved": {"describe": "training loop waiting on its data loader most of the time",
                "first": _spec(0.25, 0.20, 0.08, 0.18, 0.05, 0.0, 0.02, 0.01, 0.6, 210.0)},
    "fp32-no-tensor": {"describe": "fp32 matmuls with TF32 off: SMs busy, tensor cores idle",
                       "first": _spec(0.98, 0.79, 0.25, 0.0, 0.15, 0.0, 0.63, 0.0, 0.5, 520.0)},
    "memory-bound": {"describe": "large memory copies / elementwise kernels: DRAM saturated",
                     "first": _spec(0.99, 0.80, 0.6, 0.0, 0.85, 0.0, 0.05, 0.0, 0.7, 480.0)},
    "oversized": {"describe": "small model on a big GPU: little memory and few SMs used",
                  "first": _spec(0.70, 0.30, 0.1, 0.2, 0.05, 0.0, 0.03, 0.02, 0.06, 180.0)},
    "bf16-healthy": {"describe": "bf16 training with large matmuls: tensor cores busy", "first": _HEALTHY},
    "fp64-dgemm": {"describe": "FP64 DGEMM (cuBLAS): the FP64 tensor pipe (DFMA) busy",
                   "first": _spec(0.99, 0.92, 0.25, 0.86, 0.15, 0.0004, 0.02, 0.0, 0.5, 600.0, tensor="dfma_active")},
    "int8-gemm": {"describe": "int8 GEMMs (quantised inference): SMs busy, the integer tensor pipe (IMMA) at 12 %",
                  "first": _spec(0.98, 0.90, 0.3, 0.12, 0.3, 0.0, 0.03, 0.01, 0.4, 420.0, tensor="imma_active")},
    "one-of-n-gpus": {"describe": "job asked for several GPUs and used only the first",
                      "first": _HEALTHY, "rest": _IDLE},
}


def _jitter(job_id: int, index: int, name: str) -> float:
    """Deterministic +-1 % noise so demo jobs don't all look identical (same input, same output)."""
    h = zlib.crc32(f"{job_id}:{index}:{name}".encode())
    return ((h % 2001) - 1000) / 100000.0


def choose_profile(config: Config, job: JobContext) -> str:
    name = job.env.get("GPUEFF_SIM_PROFILE")
    if not name:
        try:
            with open(statedir.sim_profile(config.paths.state_dir, job.job_id)) as fh:
                name = fh.read().strip()
        except OSError:
            name = None
    return name or config.simulated.profile


class SimulatedCollector(Collector):
    """Synthetic figures, exact and repeatable; labelled ``simulated`` everywhere."""

    name = "simulated"

    def start(self, job: JobContext) -> dict[str, Any]:
        return {"backend": self.name, "profile": choose_profile(self.config, job)}

    def peek(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        return self.stop(job, start_state)  # figures of the profile up to job.end_time (now)

    def stop(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        if not isinstance(start_state, dict):
            return Measurement(self.name, [empty_gpu(i, self.name, NO_START) for i in job.gpu_indexes], NO_START)
        profile_name = start_state.get("profile") or choose_profile(self.config, job)
        profile = PROFILES.get(profile_name)
        if profile is None:
            reason = f"unknown simulated profile {profile_name!r} (known: {', '.join(PROFILES)})"
            return Measurement(self.name, [empty_gpu(i, self.name, reason) for i in job.gpu_indexes], reason)
        if job_slices(job.env):
            return Measurement(self.name, _mig_slices(job, profile, self.config), None)
        start, end = job.start_time, job.end_time
        elapsed = max(0.0, end - start) if start and end else None
        total = int(80 * GiB)
        gpus = []
        for pos, index in enumerate(job.gpu_indexes):
            spec = profile["first"] if pos == 0 else profile.get("rest", profile["first"])
            gpu = empty_gpu(index, self.name, None, minor=index,
                            uuid=f"GPU-5171a7ed-0000-4000-8000-{self.config.site.cluster[:4]:0>4}{job.node[-4:]:0>4}{index:04d}",
                            pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
                            model=self.config.simulated.model, memory_total_bytes=total)
            for m in FRACTIONS:
                base = spec[m]
                gpu[m] = base if base == 0.0 else min(1.0, max(0.0, base + _jitter(job.job_id, index, m)))
            power = spec["power"] * (1 + _jitter(job.job_id, index, "power"))
            gpu["power_mean_w"] = round(power, 1)
            if elapsed is None:  # no energy window: None, not 0
                gpu["missing"]["energy_j"] = "job start unknown (Prolog state lost): no energy window"
            else:
                gpu["energy_j"] = round(power * elapsed, 1)
            gpu["memory_used_peak_bytes"] = int(total * spec["mem"])
            gpu["samples"] = max(1, int(elapsed // 5)) if elapsed else 0
            gpu["timeline"] = _timeline(gpu, elapsed or 0.0, job.job_id, index)
            gpus.append(gpu)
        return Measurement(self.name, gpus, None)


def _timeline(gpu: dict[str, Any], elapsed: float, job_id: int, index: int, points: int = 24) -> list[list[float]]:
    """A coarse, plausible timeline whose mean equals the GPU's figures (ramp-up then steady)."""
    if elapsed <= 0:
        return []
    out = []
    for p in range(points):
        t = elapsed * (p + 0.5) / points
        wobble = 1.0 + 4 * _jitter(job_id, index, f"t{p}")
        ramp = 0.5 if p == 0 else 1.0
        out.append([round(t, 1)] + [round(min(1.0, (gpu[m] or 0.0) * ramp * wobble), 4)
                                    for m in ("kernel_active", "sm_active", "tensor_active")])
    return out


def _mig_slices(job: JobContext, profile: dict[str, Any], config: Config) -> list[dict[str, Any]]:
    """One entry per slice, as a real MIG node reports them: whole-GPU-only figures None with the reason."""
    out = []
    for pos, (index, mig_uuid) in enumerate(job_slices(job.env)):
        spec = profile["first"] if pos == 0 else profile.get("rest", profile["first"])
        legacy = parse_legacy_mig(mig_uuid) or {}
        total = 10 * GiB
        gpu = empty_gpu(index, "simulated", None, uuid=legacy.get("parent_uuid") or f"GPU-5171a7ed-{index:04d}",
                        model=config.simulated.model, memory_total_bytes=total, mig_uuid=mig_uuid,
                        mig_gi_id=legacy.get("gi_id", pos + 1), mig_ci_id=legacy.get("ci_id", 0),
                        mig_profile="1g.10gb")
        for m in FRACTIONS:
            if m != "kernel_active":
                gpu[m] = spec[m]
        gpu["memory_used_peak_bytes"] = int(total * spec["mem"])
        gpu["missing"] = {m: UTIL_REASON for m in ("kernel_active", "energy_j", "power_mean_w")}
        gpu["samples"] = 1
        out.append(gpu)
    return out
