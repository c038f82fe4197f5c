"""The verdicts, in the order DESIGN.md gives them (the first raised is the primary). Each is a Rule with
its text in ``text/<name>.toml``."""

from __future__ import annotations

from ..figures import GpuFigures
from .base import Context, NotAssessed, Rule, Skipped, Thresholds, Verdict


class NeverUsed(Rule):
    """1. GPU never used, judged per GPU over all the job's GPUs: in "asked for 4 GPUs, used 1" the job mean
    would hide it."""

    name = "never_used"
    severity = "critical"
    threshold = "never_used_kernel_pct"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        limit = ctx.thresholds.pct("never_used_kernel_pct")
        return [g for g in self.need(ctx.figures.gpus, "kernel_active") if (g.mean("kernel_active") or 0.0) < limit]


class Starved(Rule):
    """2. Starved: kernels ran only part of the time (input pipeline, CPU preprocessing, host overhead, I/O)."""

    name = "starved"
    severity = "warning"
    threshold = "starved_kernel_pct"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        limit = ctx.thresholds.pct("starved_kernel_pct")
        return [g for g in self.need(ctx.used, "kernel_active") if (g.mean("kernel_active") or 0.0) < limit]


class BusyNotWorking(Rule):
    """3. Busy but not working: kernels run ("100 % GPU utilization") but few SMs do, the case nvidia-smi
    cannot see. The efficiency clause catches launch-bound loops: on an H100 a Python loop of 1000-element
    adds reads kernel-active 33 %, SM-active 0.05 % -- starved by launch overhead *and* underfilled."""

    name = "busy_not_working"
    severity = "warning"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "kernel_active", "sm_active")
        k_min = ctx.thresholds.pct("busy_kernel_pct")
        s_max = ctx.thresholds.pct("busy_sm_pct")
        eff_max = ctx.thresholds.pct("busy_efficiency_pct")
        k_used = ctx.thresholds.pct("never_used_kernel_pct")

        def busy(g: GpuFigures) -> bool:
            k = g.mean("kernel_active") or 0.0
            s = g.mean("sm_active") or 0.0
            return (k >= k_min and s < s_max) or (k >= k_used and s < eff_max * k)

        return [g for g in measured if busy(g)]


class TensorIdle(Rule):
    """4. Tensor cores idle: SMs fairly busy, tensor pipe near zero while the FP32 pipe works (fp32 math)."""

    name = "tensor_idle"
    severity = "warning"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "sm_active", "tensor_active", "fp32_active")
        th = ctx.thresholds
        return [g for g in measured
                if (g.mean("sm_active") or 0.0) >= th.pct("tensor_idle_sm_pct")
                and (g.mean("tensor_active") or 0.0) < th.pct("tensor_idle_tensor_pct")
                and (g.mean("fp32_active") or 0.0) >= th.pct("tensor_idle_fp32_pct")]


class MemoryBound(Rule):
    """5. Memory-bound: DRAM bandwidth busy, tensor cores mostly idle (moving data rather than computing)."""

    name = "memory_bound"
    severity = "info"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "dram_active", "tensor_active")
        th = ctx.thresholds
        return [g for g in measured
                if (g.mean("dram_active") or 0.0) >= th.pct("memory_bound_dram_pct")
                and (g.mean("tensor_active") or 0.0) < th.pct("memory_bound_tensor_pct")]


class Oversized(Rule):
    """6. Oversized: little GPU memory used and few SMs active; a smaller GPU or a MIG slice would do."""

    name = "oversized"
    severity = "info"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        measured = self.need(ctx.used, "memory_fraction", "sm_active")
        th = ctx.thresholds
        return [g for g in measured
                if (g.memory_fraction or 0.0) < th.pct("oversized_memory_pct")
                and (g.mean("sm_active") or 0.0) < th.pct("oversized_sm_pct")]


class Healthy(Rule):
    """7. Healthy: every check ran and none found a problem. Not claimed when a check could not run."""

    name = "healthy"
    severity = "ok"

    def hits(self, ctx: Context) -> list[GpuFigures]:
        if ctx.raised or not ctx.used:
            return []
        if ctx.skipped:
            raise NotAssessed("not every check could run (see above), so the job is not called healthy")
        return ctx.used


RULES: tuple[Rule, ...] = (NeverUsed(), Starved(), BusyNotWorking(), TensorIdle(), MemoryBound(),
                           Oversized(), Healthy())


def label_of(name: str) -> str:
    """A verdict's plain name ("GPU never used"); the name itself where no rule has it (an old row)."""
    return next((r.label for r in RULES if r.name == name), name)


__all__ = ["RULES", "Context", "NotAssessed", "Rule", "Skipped", "Thresholds", "Verdict", "label_of"]
