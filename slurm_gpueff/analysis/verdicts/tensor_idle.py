"""4. Tensor cores idle: SMs fairly busy, tensor pipe near zero while the FP32 pipe works (fp32 math).

Not for FP64 or integer math (analysis/precision.py): its advice (bf16, TF32) would be wrong there."""

from __future__ import annotations

from ..figures import GpuFigures
from ..precision import not_fp32_math
from .base import Context, Rule


class TensorIdle(Rule):
    name = "tensor_idle"
    severity = "warning"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "sm_active", "tensor_active", "fp32_active")
        th = ctx.thresholds
        return [g for g in measured
                if (g.mean("sm_active") or 0.0) >= th.pct("tensor_idle_sm_pct")
                and (g.mean("tensor_active") or 0.0) < th.pct("tensor_idle_tensor_pct")
                and (g.mean("fp32_active") or 0.0) >= th.pct("tensor_idle_fp32_pct")
                and not not_fp32_math(g.means)]
