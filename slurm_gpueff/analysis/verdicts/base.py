"""What every verdict shares: the Verdict result, the Rule base class, thresholds and message texts.

A rule looks at the job's figures and either raises a verdict (returning the values its message
needs), returns None (the problem is absent), or raises :class:`NotAssessed` when a figure it needs
was not measured: we never guess from a missing figure, and the card says what could not be assessed.

Message texts live in ``text/<name>.toml`` (``label``: the check's plain name; ``title`` and ``why``
with ``{placeholders}``; ``advice``: a list of two or three things to try), so they can be reworded
without touching the logic. Placeholders: see :meth:`Rule.values`.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

from ..figures import LABELS, GpuFigures, JobFigures, combine


class NotAssessed(Exception):  # noqa: N818 - a signal, not an error
    """A rule could not run because a figure it needs was not measured (the message says which).

    ``figure`` names the missing figure ("SM activity") and ``detail`` says why, so renderers can
    group checks that failed for the same underlying reason.
    """

    def __init__(self, message: str, figure: str | None = None, detail: str | None = None):
        super().__init__(message)
        self.figure = figure
        self.detail = detail if detail is not None else message


@dataclass(frozen=True)
class Verdict:
    """One diagnosis for a job. ``gpus`` are ``(node, index)`` of the GPUs it concerns."""

    name: str
    title: str
    severity: str
    why: str
    advice: list[str]
    gpus: list[tuple[str, int]] = field(default_factory=list)


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

    def __init__(self, source: Any = None):
        from ...config import SCHEMA

        values = {k: default for k, (_t, default) in SCHEMA["analysis"].items()}
        if source is not None:
            given = source if isinstance(source, Mapping) else source.as_dict()
            values.update(given)
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


def pct(x: float | None) -> str:
    """A fraction as a short percentage for messages ("0.8%", "42%"; no space, so wrapping keeps it whole)."""
    if x is None:
        return "n/a"
    v = 100.0 * x
    if 0 < v < 1:  # 0.05 % must not read as 0.1 % or 0 %: a measured small value is not zero
        return f"{v:.2f}%"
    return f"{v:.1f}%" if v < 10 else f"{v:.0f}%"


def of_n(involved: int, total: int, noun: str = "GPU") -> str:
    """'the GPU', 'both GPUs', '3 of 4 GPUs', 'all 4 GPUs'."""
    if total == 1:
        return f"the {noun}"
    if involved == total:
        return f"both {noun}s" if total == 2 else f"all {total} {noun}s"
    return f"{involved} of {total} {noun}{'s' if total > 1 else ''}"


@cache
def load_text(name: str) -> dict[str, Any]:
    """The message template of a verdict (validated: title, why, 2-3 advice items)."""
    path = resources.files("slurm_gpueff.analysis.verdicts").joinpath("text", f"{name}.toml")
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    advice = data.get("advice")
    for key in ("label", "title", "why"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ValueError(f"verdict text {name}.toml needs a string {key!r}")
    if not isinstance(advice, list) or not 2 <= len(advice) <= 3 or not all(isinstance(a, str)
                                                                            for a in advice):
        raise ValueError(f"verdict text {name}.toml needs 'advice': a list of 2 or 3 strings")
    return data


class Rule:
    """Base class of one verdict. Subclasses set ``name``/``severity`` and implement :meth:`check`."""

    name = ""
    severity = "warning"

    def check(self, ctx: Context) -> tuple[dict[str, Any], Sequence[GpuFigures]] | None:
        """Return (message values, GPUs involved) if the verdict applies, None if it does not.

        Raise :class:`NotAssessed` when a needed figure is missing.
        """
        raise NotImplementedError

    @property
    def label(self) -> str:
        """Plain name of the check (no placeholders), for "could not assess" lists."""
        return str(load_text(self.name)["label"])

    def verdict(self, values: Mapping[str, Any], gpus: Sequence[GpuFigures]) -> Verdict:
        text = load_text(self.name)
        fmt = dict(values)
        return Verdict(name=self.name, title=text["title"].format_map(fmt), severity=self.severity,
                       why=" ".join(text["why"].format_map(fmt).split()),
                       advice=[" ".join(a.format_map(fmt).split()) for a in text["advice"]],
                       gpus=[(g.node, g.index) for g in gpus])

    # Helpers for subclasses -------------------------------------------------------------------

    @staticmethod
    def need(gpus: Sequence[GpuFigures], *metrics: str) -> list[GpuFigures]:
        """GPUs on which every metric was measured; NotAssessed if there are none."""
        ok = [g for g in gpus if all(_value(g, m) is not None for m in metrics)]
        if gpus and not ok:
            for m in metrics:
                lacking = [g for g in gpus if _value(g, m) is None]
                if lacking:
                    label, why = LABELS.get(m, m), _missing_reason(lacking[0], m)
                    raise NotAssessed(f"{label}: {why}", figure=label, detail=why)
        return ok

    @staticmethod
    def values(ctx: Context, involved: Sequence[GpuFigures]) -> dict[str, Any]:
        """Message values over the involved GPUs: k, s, t, d, fp32, mem (as text) and the GPU phrase."""
        agg = combine(list(involved))
        n_all = ctx.figures.gpu_count
        were = "was" if len(involved) == 1 else "were"
        vals = {
            "were": were,
            "k": pct(agg.mean("kernel_active")), "s": pct(agg.mean("sm_active")),
            "t": pct(agg.mean("tensor_active")), "d": pct(agg.mean("dram_active")),
            "fp32": pct(agg.mean("fp32_active")), "o": pct(agg.mean("sm_occupancy")),
            "mem": pct(agg.memory_fraction), "eff": pct(agg.efficiency),
            "gpus": of_n(len(involved), n_all), "n": len(involved), "total": n_all,
            "gpu_list": ", ".join(g.label for g in involved),
            "hours": f"{agg.hours:.2f}" if agg.hours is not None else "n/a",
        }
        mem_used = agg.memory_used_peak_bytes
        vals["mem_gib"] = f"{mem_used / 1024**3:.1f}" if mem_used is not None else "n/a"
        total = agg.memory_total_bytes
        vals["total_gib"] = f"{total / 1024**3:.0f}" if total else "n/a"
        phrase = vals["gpus"]
        vals["Gpus"] = phrase[0].upper() + phrase[1:]
        vals["gpus_title"] = "GPU" if n_all == 1 else vals["Gpus"]
        vals["on_gpus"] = "" if len(involved) == n_all else f" on {vals['gpus']} ({vals['gpu_list']})"
        return vals


def _missing_reason(g: GpuFigures, metric: str) -> str:
    if metric == "memory_fraction":
        key = "memory_used_peak_bytes" if g.memory_used_peak_bytes is None else "memory_total_bytes"
        return g.missing.get(key) or "not measured"
    return g.missing.get(metric) or "not measured"


def _value(g: GpuFigures, metric: str) -> Any:
    if metric == "memory_fraction":
        return g.memory_fraction
    return g.means.get(metric)
