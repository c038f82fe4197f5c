"""Tensor activity by precision: which tensor pipes did the work (GPM or DCGM; docs/FIGURES.md).

"Tensor 81 %" reads differently for an FP64 DGEMM (the DFMA pipe) than for bf16 training (HMMA), and
"tensor 12 %" on an int8 GEMM (IMMA) is not a bf16 job that forgot autocast. The three precision pipes add
up to the tensor figure; naming the ones that worked makes the figure explain itself, and keeps advice
meant for FP32 math (switch to bf16) away from FP64 and integer jobs.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..fmt import pct

# HMMA runs every floating-point matrix type below FP64 (FP16, BF16, TF32, FP8), not only FP16/BF16.
PRECISIONS = (("hmma_active", "HMMA: FP16/BF16/TF32/FP8"), ("imma_active", "INT8 IMMA"),
              ("dfma_active", "FP64 DFMA"))
SHOWN_FROM = 0.0005  # a pipe below 0.05 % is not worth naming


def split(means: Mapping[str, float | None]) -> str | None:
    """ "FP64 DFMA 81.0%", or the precisions that worked, largest first; None where none was measured."""
    parts = [(label, v) for key, label in PRECISIONS if (v := means.get(key)) is not None and v >= SHOWN_FROM]
    if not parts:
        return None
    return ", ".join(f"{label} {pct(v)}" for label, v in sorted(parts, key=lambda p: -p[1]))


def dominant(means: Mapping[str, float | None]) -> str | None:
    """The precision (a PRECISIONS key) with at least half of the measured tensor activity, else None."""
    known = {key: v for key, _label in PRECISIONS if (v := means.get(key)) is not None}
    total = sum(known.values())
    if total <= 0:
        return None
    key, v = max(known.items(), key=lambda kv: kv[1])
    return key if v >= 0.5 * total else None


def not_fp32_math(means: Mapping[str, float | None]) -> bool:
    """The job's math is FP64 or integer, not FP32: bf16/TF32 advice does not apply to it."""
    fp64, fp32 = means.get("fp64_active"), means.get("fp32_active")
    return dominant(means) in ("imma_active", "dfma_active") or (
        fp64 is not None and fp32 is not None and fp64 > 0 and fp64 >= fp32)
