"""The per-job card's presenter: one analysed job into the context of ``card.html.j2`` and ``card.txt.j2``.

The plain text embeds the ``seff-gpu`` card, so users see the same words in their terminal and their
inbox; it must read well alone, because many mail clients show only it. Text from the job (its name,
user, account) is untrusted: Jinja2 escapes it in HTML, and :func:`clean` strips control characters (a
newline in a job name must not start a new line in the text part nor a new header in the mail).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from .. import fmt
from ..analysis.diagnose import Diagnosis
from ..analysis.figures import JobFigures
from ..analysis.precision import split
from ..config import Config
from ..readmodel import JobRow, Points
from ..render.text import (
    SIM_BANNER,
    Runs,
    cpu_line,
    gpus_line,
    measured_by,
    na,
    note,
    render_card,
    runs_line,
    state_text,
)
from . import charts
from .pages import Page, render, sentence
from .prices import Prices, bar_part, share

CHART_CID = "activity-chart"
TIMES = "\u00d7"
_CONTROL = re.compile(f"(?:[\\n\\t]|{fmt.UNSEEN.pattern})+")  # in mail: a space, for a name on one line


def clean(text: str | None, limit: int = 80) -> str:
    """Untrusted text for one line: control characters (newlines too) become a space; length bounded."""
    if not text:
        return ""
    out = _CONTROL.sub(" ", str(text)).strip()
    return out if len(out) <= limit else out[: limit - 1] + "\u2026"


def _memory(fig: JobFigures) -> str:
    used, total = fig.memory_used_peak_bytes, fig.memory_total_bytes
    if used is None:
        return na(fig.missing.get("memory"))
    where = " (fullest GPU)" if fig.gpu_count > 1 else ""
    if not total:
        return f"{fmt.gib(used)} GiB{where}"
    return f"{fmt.gib(used)} of {fmt.gib(total)} GiB, {fmt.pct(fig.memory_fraction)}{where}"


def _levels(fig: JobFigures) -> list[dict[str, Any]]:
    colors = {"kernel_active": "kernel", "sm_active": "sm", "tensor_active": "tensor", "dram_active": "kernel"}
    return [{"key": key, "value": fig.mean(key), "text": fmt.pct(fig.mean(key)), "color": charts.COLORS[c],
             "missing": (fig.missing.get(key) or "not measured") if fig.mean(key) is None else fig.missing.get(key)}
            for key, c in colors.items()]


def _gpu_cost(fig: JobFigures, prices: Prices, part: str) -> float | None:
    """The cost of a part of the split (or of all the hours: "allocated"), priced per GPU model."""
    return prices.total((g.hours if part == "allocated" else getattr(g.waste, part), g.model) for g in fig.gpus)


def _split(fig: JobFigures, prices: Prices) -> list[dict[str, Any]]:
    return [bar_part(key, getattr(fig.waste, f"{key}_h"), fig.hours, prices.fmt(_gpu_cost(fig, prices, f"{key}_h")),
                     charts.COLORS[color])
            for key, color in (("sm_active", "active"), ("underfilled", "underfilled"), ("idle", "idle"))]


def _gpu_rows(fig: JobFigures, diag: Diagnosis, never_used_pct: float) -> list[dict[str, Any]]:
    first = diag.gpu_verdicts()
    return [{"label": g.label, "hours": fmt.gpu_hours(g.hours), "kernel": g.mean("kernel_active"),
             "sm": g.mean("sm_active"), "tensor": g.mean("tensor_active"), "dram": g.mean("dram_active"),
             "mem": fmt.gib(g.memory_used_peak_bytes), "verdict": first.get((g.node, g.index), "\u2013"),
             "idle": 100.0 * (g.mean("kernel_active") or 0.0) < never_used_pct
             and g.mean("kernel_active") is not None}
            for g in fig.gpus]


def build_card(job: JobRow, fig: JobFigures, diag: Diagnosis, timelines: Sequence[Points],
               config: Config, *, optout_hint: bool = True, runs: Runs = ()) -> Page:
    """Render one job's card (HTML context, plain text, chart); ``runs`` as for the terminal card."""
    rep = config.reports
    prices = Prices(rep.price_per_gpu_hour, rep.currency)
    gpu_rows = _gpu_rows(fig, diag, float(config.analysis.never_used_kernel_pct)) if fig.gpu_count > 1 else []
    idle = sum(r["idle"] for r in gpu_rows)
    label = fmt.job_label(job)
    name = clean(job.job_name, 60)
    w = fig.waste
    lost_cost = [_gpu_cost(fig, prices, "idle_h"), _gpu_cost(fig, prices, "underfilled_h")]
    ran = f"{fmt.utc(job.start_time)} \u2192 {fmt.utc(job.end_time)} ({fmt.hms(fig.elapsed_s)})"
    who = f"{clean(job.user) or 'n/a'} / {clean(job.account) or 'n/a'}"
    total_cost = prices.fmt(_gpu_cost(fig, prices, "allocated"))
    ctx: dict[str, Any] = {
        "job_label": label, "name": name, "cluster": clean(job.cluster),
        "user": clean(job.user) or "n/a", "simulated": "simulated" in fig.backends, "sim_banner": SIM_BANNER,
        "verdicts": [{"title": v.title, "why": v.why, "advice": list(v.advice), "severity": v.severity}
                     for v in diag.verdicts],
        "verdict_title": diag.primary.title if diag.primary else None,
        "skipped_all": "; ".join(s.reason for s in diag.skipped if s.name == "all"),
        "byline": f"{who} \u00b7 {ran}", "ended": fmt.utc(job.end_time), "gpu_count": fig.gpu_count,
        "hours": fmt.gpu_hours(fig.hours), "hours_known": fig.hours is not None,
        "idle": fmt.gpu_hours(w.idle_h), "idle_share": fmt.pct(share(w.idle_h, fig.hours)),
        "active": fmt.gpu_hours(w.sm_active_h), "active_share": fmt.pct(share(w.sm_active_h, fig.hours)),
        "lost": fmt.gpu_hours((w.idle_h or 0.0) + (w.underfilled_h or 0.0)),
        "lost_cost": None if None in lost_cost else prices.fmt(sum(c or 0.0 for c in lost_cost)),
        "split": _split(fig, prices), "split_reason": w.reason, "prices": prices.enabled,
        "levels": _levels(fig), "cost_total": total_cost, "efficiency": fmt.pct(fig.efficiency),
        "sm": fmt.pct(fig.mean("sm_active")) if fig.mean("sm_active") is not None else None,
        # how many GPUs of a multi-GPU job ran kernels, when some never did and every one was measured
        "gpus_used": fig.gpu_count - idle if idle and all(r["kernel"] is not None for r in gpu_rows) else None,
        "gpu_rows": gpu_rows,
        "details": [
            ("Job", label if label == str(job.job_id) else f"{label} (raw id {job.job_id})"),
            *([("Name", name)] if name else []),
            ("User / account", who), ("Cluster / partition", f"{clean(job.cluster)} / {clean(job.partition) or 'n/a'}"),
            ("State", state_text(job, config.sacct.accounting)), ("Ran", ran),
            ("GPUs", f"{gpus_line(job, fig, TIMES)} on {clean(job.nodelist, 200) or 'n/a'}"),
            ("GPU-hours allocated", fmt.gpu_hours(fig.hours) + (f" ({total_cost})" if total_cost else "")),
            *([("Runs", runs_line(runs))] if len(runs) > 1 else []),
            *([("Tensor by precision", tensor_split)] if (tensor_split := split(fig.means)) else []),
            ("Peak GPU memory", _memory(fig)),
            *([("CPU", cpu)] if (cpu := cpu_line(fig)) else []),
            ("Energy", fmt.energy(fig.energy_j) if fig.energy_j is not None else na(fig.missing.get("energy_j"))),
            *([("Coverage", fig.coverage_note)] if fig.coverage_note else []),
            *([("Note", clean(text, 1024))] if (text := note(job, fig)) else []),
        ],
        "not_assessed": [f"{s.title}: {s.reason}" for s in diag.not_assessed],
        "measured_by": measured_by(job, fig),
        "optout": optout_hint, "min_hours": rep.card_min_gpu_hours, "only_unhealthy": rep.card_only_unhealthy,
        "contact": clean(rep.contact, 200),
    }
    # The terminal card is built from the same (sanitised-on-input) fields; strip control characters that
    # a job name could still carry into it.
    terminal = render_card(job, fig, diag, runs, accounting=config.sacct.accounting)
    seff = "\n".join(_CONTROL.sub(" ", line) for line in terminal.splitlines())
    return Page("card.html.j2", subject=sentence("card_subject", **ctx),
                text=render("card.txt.j2", **ctx, seff=seff), chart=charts.job_chart(timelines, fig.gpu_count),
                context=ctx)
