"""What every verdict shares: the Verdict result, the Rule base class, thresholds and message texts
(``text/<name>.toml``; placeholders: :func:`_values`). See docs/DESIGN.md, "Verdicts"."""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache, cached_property
from importlib import resources
from typing import Any

from ...config import AnalysisConfig
from ...fmt import gib, gpu_hours, pct
from ..figures import LABELS, NOT_MEASURED, GpuFigures, JobFigures, combine
from ..precision import split

ThresholdSource = Mapping[str, float] | AnalysisConfig | None


class NotAssessed(Exception):  # noqa: N818 - a signal, not an error
    """A figure a rule needs was not measured: ``figure`` names it and ``detail`` says why, so renderers can
    group checks that failed for the same underlying reason."""

    def __init__(self, message: str, figure: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.figure = figure
        self.detail = detail if detail is not None else message


@dataclass(frozen=True)
class Verdict:
    """One diagnosis for a job: the decision as data (the rule, its severity, ``gpus`` as ``(node, index)`` of
    the GPUs it concerns) and its words, rendered from the rule's text file when first read. Summarising a
    job reads only the first verdict's title, and rendering every verdict's words was a third of that."""

    name: str
    severity: str
    gpus: list[tuple[str, int]]
    words: Callable[[], tuple[str, str, list[str]]] = field(repr=False, compare=False)

    @cached_property
    def _words(self) -> tuple[str, str, list[str]]:
        return self.words()

    @property
    def title(self) -> str:
        return self._words[0]

    @property
    def why(self) -> str:
        return self._words[1]

    @property
    def advice(self) -> list[str]:
        return self._words[2]


@dataclass(frozen=True)
class Skipped:
    """A rule that could not be assessed, and why (``reason`` = "<figure>: <detail>" where known)."""

    name: str
    title: str
    reason: str
    figure: str | None = None
    detail: str | None = None


class Thresholds:
    """Read-only view of ``config.analysis`` (a Section, a dict, or None for the schema defaults)."""

    def __init__(self, source: ThresholdSource = None):
        values: dict[str, Any] = AnalysisConfig().as_dict()
        if source is not None:
            values.update(source if isinstance(source, Mapping) else source.as_dict())
        self._values = values

    def pct(self, key: str) -> float:
        """A ``*_pct`` threshold as a fraction in [0, 1] (figures are fractions internally)."""
        return float(self._values[key]) / 100.0

    def __getitem__(self, key: str) -> float:
        return float(self._values[key])


@dataclass
class Context:
    """What a rule sees: the job figures, the GPUs still in play, thresholds, verdicts raised so far."""

    figures: JobFigures
    used: list[GpuFigures]
    thresholds: Thresholds
    raised: list[Verdict] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)


def of_n(involved: int, total: int) -> str:
    """'the GPU', 'both GPUs', '3 of 4 GPUs', 'all 4 GPUs'."""
    if total == 1:
        return "the GPU"
    if involved == total:
        return "both GPUs" if total == 2 else f"all {total} GPUs"
    return f"{involved} of {total} GPUs"


@cache
def load_text(name: str) -> dict[str, Any]:
    """The message template of a verdict (validated: title, why, 2-3 advice items)."""
    path = resources.files("slurm_gpueff.analysis.verdicts").joinpath("text", f"{name}.toml")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    for key in ("label", "title", "why"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ValueError(f"verdict text {name}.toml needs a string {key!r}")
    for part in (data, *(v for v in data.values() if isinstance(v, dict))):
        advice = part.get("advice")
        if not (isinstance(advice, list) and 2 <= len(advice) <= 3 and all(isinstance(a, str) for a in advice)):
            raise ValueError(f"verdict text {name}.toml needs 'advice': a list of 2 or 3 strings")
        if not isinstance(part.get("why"), str) or not isinstance(part.get("title"), str):
            raise ValueError(f"verdict text {name}.toml: every part needs a 'title' and a 'why'")
    return data


class Rule:
    """One verdict: subclasses set ``name`` (its text file) and ``severity`` and implement :meth:`hits`."""

    name = ""
    severity = "warning"
    threshold: str | None = None  # the ``*_pct`` key its message prints as ``{thr}``

    def hits(self, ctx: Context) -> Sequence[GpuFigures]:
        """The GPUs the verdict concerns (empty: it does not apply); NotAssessed when a figure is missing."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """Plain name of the check (no placeholders), for "could not assess" lists."""
        return str(load_text(self.name)["label"])

    def verdict(self, ctx: Context, gpus: Sequence[GpuFigures], variant: str | None = None) -> Verdict:
        """The verdict's text; a ``variant`` (a table of the text file) replaces what it names."""
        involved = list(gpus)
        threshold = pct(ctx.thresholds.pct(self.threshold)) if self.threshold else None

        def words() -> tuple[str, str, list[str]]:  # reads only what stays as it is: the figures, the GPUs
            text = load_text(self.name)
            if variant:
                text = {**text, **text[variant]}
            values = _values(ctx, involved)
            if threshold is not None:
                values["thr"] = threshold
            return (text["title"].format_map(values), " ".join(text["why"].format_map(values).split()),
                    [" ".join(a.format_map(values).split()) for a in text["advice"]])

        return Verdict(name=self.name, severity=self.severity, gpus=[(g.node, g.index) for g in involved],
                       words=words)

    @staticmethod
    def need(gpus: Sequence[GpuFigures], *metrics: str) -> list[GpuFigures]:
        """GPUs on which every metric was measured; NotAssessed if there are none."""
        ok = [g for g in gpus if all(_value(g, m) is not None for m in metrics)]
        if gpus and not ok:  # the first metric some GPU lacks, with that GPU's reason
            metric, lacking = next((m, g) for m in metrics for g in gpus if _value(g, m) is None)
            label, why = LABELS.get(metric, metric), _missing_reason(lacking, metric)
            raise NotAssessed(f"{label}: {why}", figure=label, detail=why)
        return ok


def cpu_case(ctx: Context) -> str | None:
    """What the job's CPUs did, for the verdicts whose text depends on it: "busy" (efficiency at least
    ``starved_cpu_busy_pct``), "idle" (under ``starved_cpu_idle_pct``), None between or when unknown."""
    eff, th = ctx.figures.cpu.efficiency, ctx.thresholds
    if eff is not None and eff >= th.pct("starved_cpu_busy_pct"):
        return "busy"
    if eff is not None and eff < th.pct("starved_cpu_idle_pct"):
        return "idle"
    return None


def _values(ctx: Context, involved: Sequence[GpuFigures]) -> dict[str, str]:
    """A message's placeholders over the involved GPUs: k, s, t, d, fp32, mem (as text) and the GPU phrase."""
    agg = combine(list(involved))
    n_all = ctx.figures.gpu_count
    phrase = of_n(len(involved), n_all)
    vals = {
        "were": "was" if len(involved) == 1 else "were",
        "k": pct(agg.mean("kernel_active")), "s": pct(agg.mean("sm_active")),
        "t": pct(agg.mean("tensor_active")), "d": pct(agg.mean("dram_active")),
        "fp32": pct(agg.mean("fp32_active")), "o": pct(agg.mean("sm_occupancy")),
        "mem": pct(agg.memory_fraction), "eff": pct(agg.efficiency),
        "gpus": phrase, "n": str(len(involved)), "total": str(n_all),
        "gpu_list": ", ".join(g.label for g in involved),
        "hours": gpu_hours(agg.hours), "mem_gib": gib(agg.memory_used_peak_bytes),
        "total_gib": gib(agg.memory_total_bytes or None),
    }
    cpu = ctx.figures.cpu
    vals["cpus"] = str(cpu.alloc_cpus) if cpu.alloc_cpus else "allocated"
    vals["cpu_eff"] = pct(cpu.efficiency)
    vals["cpu_note"] = (f"The job's CPUs were busy {pct(cpu.efficiency)} of the time, which does not tell which "
                        "case it is." if cpu.efficiency is not None else
                        f"Its CPU efficiency is not known ({cpu.missing.get('cpu_efficiency', 'not measured')}).")
    tensor_split = split(agg.means)
    vals["tensor_split"] = f" ({tensor_split})" if tensor_split else ""
    vals["Gpus"] = phrase[0].upper() + phrase[1:]
    vals["gpus_title"] = "GPU" if n_all == 1 else vals["Gpus"]
    vals["on_gpus"] = "" if len(involved) == n_all else f" on {phrase} ({vals['gpu_list']})"
    vals.update(_shared_values(involved))
    return vals


def shared_gpus(gpus: Sequence[GpuFigures]) -> list[GpuFigures]:
    """The GPUs the job held a share of (Slurm shards, or measured with other jobs on them)."""
    return [g for g in gpus if g.share is not None and g.share < 1.0 - 1e-9]


def _shared_values(involved: Sequence[GpuFigures]) -> dict[str, str]:
    """Placeholders of the shared-GPU variants: the share held (in shards where Slurm gave them), the shards
    its work would fit in, and how busy the whole GPU was."""
    g = next(iter(shared_gpus(involved)), None)
    if g is None:
        return {}
    own = g.own or {}
    held = (f"{g.shards} of the GPU's {g.shard_count} shards" if g.shards and g.shard_count
            else f"{pct(g.share)} of the GPU")
    need = max(own.get("sm_active") or 0.0, own.get("kernel_active") or 0.0, g.memory_fraction or 0.0)
    if g.shard_count:
        n = max(1, math.ceil(need * g.shard_count))
        fit = f"{n} shard{'s' if n > 1 else ''} (--gres=shard:{n})"
    else:
        fit = f"{pct(max(need, 0.01))} of a GPU"
    busy = g.shared.gpu_kernel_active if g.shared else None
    return {"held": held, "fit": fit, "gpu_busy": pct(busy) if busy is not None else "n/a",
            "with": ", ".join(g.shared.others if g.shared else ()) or "other jobs"}


def _missing_reason(g: GpuFigures, metric: str) -> str:
    if metric == "memory_fraction":
        metric = "memory_used_peak_bytes" if g.memory_used_peak_bytes is None else "memory_total_bytes"
    return g.missing.get(metric) or NOT_MEASURED


def _value(g: GpuFigures, metric: str) -> float | None:
    return g.memory_fraction if metric == "memory_fraction" else g.means.get(metric)
