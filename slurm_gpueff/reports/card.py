"""The per-job efficiency card: one job's figures, verdict and advice as an HTML page and a plain text.

Both parts come from the same context. The plain text is the ``seff-gpu`` card (so users see the same
words in their terminal and their inbox) between a short introduction and the cost; it must read well
alone, because many mail clients show only it. The HTML part uses inline CSS only (mail clients strip
``<style>``), tables for layout and bars (no images but the chart), and no remote content: the chart is
a PNG attached inline (``cid:``) in mail, a file next to the archived page, or a ``data:`` URI in a
stand-alone file (``seff-gpu --html``).

Text from the job (its name, user, account) is untrusted: Jinja2 escapes it in HTML, and
:func:`clean` strips control characters (a newline in a job name must not start a new line in the text
part nor a new header in the mail).
"""

from __future__ import annotations

import base64
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..analysis.diagnose import Diagnosis
from ..analysis.figures import JobFigures, naive_utc
from ..analysis.verdicts import RULES
from ..models import Job
from ..render.text import SIM_BANNER, energy, hms, job_label, measured_by, render_card, state_text
from . import charts, fmt
from .templates import render

SEVERITY_COLORS = {"critical": "#b3261e", "warning": "#9a5b00", "info": "#2a5db0", "ok": "#1b7f3b"}
SEVERITY_BG = {"critical": "#fdecea", "warning": "#fff4e0", "info": "#eaf1fb", "ok": "#e8f5ec"}
CHART_CID = "activity-chart"
_CONTROL = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")
GiB = 1024**3


def clean(text: str | None, limit: int = 80) -> str:
    """Untrusted text for one line: control characters (newlines too) become a space; length bounded."""
    if not text:
        return ""
    out = _CONTROL.sub(" ", str(text)).strip()
    return out if len(out) <= limit else out[: limit - 1] + "\u2026"


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _when(dt: datetime | None) -> str:
    dt = naive_utc(dt)
    return "n/a" if dt is None else dt.strftime("%Y-%m-%d %H:%M UTC")


def _gpus_line(job: Job, fig: JobFigures) -> str:
    counts: dict[str, int] = {}
    for g in fig.gpus:
        name = g.model or job.gpu_type or "unknown model"
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{n} \u00d7 {m}" for m, n in counts.items()) or str(job.gpu_count)


def _memory(fig: JobFigures) -> str:
    used, total = fig.memory_used_peak_bytes, fig.memory_total_bytes
    if used is None:
        return f"n/a ({fig.missing.get('memory') or 'not measured'})"
    where = " (fullest GPU)" if fig.gpu_count > 1 else ""
    if not total:
        return f"{used / GiB:.1f} GiB{where}"
    return f"{used / GiB:.1f} of {total / GiB:.0f} GiB, {fmt.pct(fig.memory_fraction)}{where}"


def used_gpus_phrase(fig: JobFigures, never_used_pct: float) -> str | None:
    """"1 of 4 GPUs did all the work" when some GPUs of a multi-GPU job never ran a kernel."""
    if fig.gpu_count < 2:
        return None
    measured = [g for g in fig.gpus if g.mean("kernel_active") is not None]
    if len(measured) < fig.gpu_count:
        return None
    used = [g for g in measured if (g.mean("kernel_active") or 0.0) * 100.0 >= never_used_pct]
    if len(used) == fig.gpu_count:
        return None
    if not used:
        return f"None of the {fig.gpu_count} GPUs did any work"
    return f"{len(used)} of {fig.gpu_count} GPUs did all the work"


@dataclass
class Card:
    """A rendered card: ``html(src)`` puts the chart at ``src`` (``cid:...``, a file name, a data URI)."""

    job: Job
    subject: str
    text: str
    chart: bytes | None
    context: dict[str, Any] = field(default_factory=dict)

    def html(self, chart_src: str | None = None) -> str:
        src = chart_src if chart_src is not None else (data_uri(self.chart) if self.chart else "")
        return render("card.html.j2", **self.context, chart_src=src if self.chart else "")

    def standalone_html(self) -> str:
        """One self-contained file: the chart as a data: URI (``seff-gpu --html``)."""
        return self.html(data_uri(self.chart) if self.chart else "")


def _levels(fig: JobFigures) -> list[dict[str, Any]]:
    m = fig.missing
    rows = []
    for key, label, note in (
        ("kernel_active", "Kernel-active", "a kernel was running: what nvidia-smi calls \u201cGPU utilization\u201d"),
        ("sm_active", "SM-active", "share of the GPU's multiprocessors doing work: the number that matters"),
        ("tensor_active", "Tensor-active", "tensor-core pipes busy (bf16/fp16/TF32 matrix math)"),
        ("dram_active", "DRAM-active", "memory bandwidth in use, as a share of the peak"),
    ):
        v = fig.mean(key)
        rows.append({"label": label, "value": v, "text": fmt.pct(v), "note": note,
                     "missing": (m.get(key) or "not measured") if v is None else m.get(key),
                     "color": charts.COLORS[{"kernel_active": "kernel", "sm_active": "sm",
                                             "tensor_active": "tensor"}.get(key, "kernel")]})
    return rows


def _gpu_cost(fig: JobFigures, prices: fmt.Prices, part: str) -> float | None:
    total = 0.0
    for g in fig.gpus:
        h = g.hours if part == "allocated" else getattr(g.waste, part)
        c = prices.cost(h, g.model)
        if c is None:
            return None
        total += c
    return total


def _split(fig: JobFigures, prices: fmt.Prices) -> list[dict[str, Any]]:
    w = fig.waste
    rows = []
    for key, label, color, explain in (
        ("sm_active_h", "SM-active", charts.COLORS["active"], "the multiprocessors were working"),
        ("underfilled_h", "Busy, SMs not active", charts.COLORS["underfilled"],
         "a kernel ran, but most of the GPU sat idle"),
        ("idle_h", "Idle", charts.COLORS["idle"], "no kernel running at all"),
    ):
        h = getattr(w, key)
        cost = _gpu_cost(fig, prices, key) if prices.enabled else None
        rows.append({"label": label, "hours": h, "hours_text": fmt.hours(h),
                     "share": fmt.share(h, fig.hours), "share_text": fmt.pct(fmt.share(h, fig.hours)),
                     "cost_text": prices.fmt(cost) if prices.enabled else None, "color": color,
                     "explain": explain})
    return rows


def headline(fig: JobFigures, prices: fmt.Prices) -> str:
    """One sentence that says where the GPU-hours went (or why we cannot say)."""
    w = fig.waste
    if fig.hours is None:
        return "The job's allocated time is not known, so its GPU-hours cannot be split."
    held = f"Of the {fmt.hours(fig.hours)} GPU-hours this job held"
    if w.sm_active_h is None:
        if w.idle_h is not None:
            return (f"{held}, {fmt.hours(w.idle_h)} ({fmt.pct(fmt.share(w.idle_h, fig.hours))}) had no kernel "
                    f"running; how much of the GPU worked the rest of the time was not measured ({w.reason}).")
        return f"{held}, how they were used was not measured ({w.reason})."
    lost = (w.idle_h or 0.0) + (w.underfilled_h or 0.0)
    cost = ""
    if prices.enabled:
        c_idle, c_under = _gpu_cost(fig, prices, "idle_h"), _gpu_cost(fig, prices, "underfilled_h")
        if c_idle is not None and c_under is not None:
            cost = f" (about {prices.fmt(c_idle + c_under)})"
    whose = "the GPU's" if fig.gpu_count == 1 else "the GPUs'"
    return (f"{held}, {whose} multiprocessors were working for {fmt.hours(w.sm_active_h)} GPU-hours "
            f"({fmt.pct(fmt.share(w.sm_active_h, fig.hours))}); {fmt.hours(lost)} GPU-hours{cost} went to "
            f"idle or barely-used GPUs.")


def _not_assessed(diag: Diagnosis) -> list[str]:
    skipped = diag.skipped
    if len(skipped) > 1:
        skipped = [s for s in skipped if s.name != "healthy"]
    return [f"{s.title}: {s.reason}" for s in skipped]


def _gpu_rows(fig: JobFigures, diag: Diagnosis, never_used_pct: float) -> list[dict[str, Any]]:
    labels_of = {r.name: r.label for r in RULES}
    first: dict[tuple[str, int], str] = {}
    for v in diag.verdicts:
        for ref in v.gpus:
            first.setdefault(ref, labels_of.get(v.name, v.name))
    return [{"label": g.label, "hours": fmt.hours(g.hours), "kernel": g.mean("kernel_active"),
             "sm": g.mean("sm_active"), "tensor": g.mean("tensor_active"), "dram": g.mean("dram_active"),
             "mem": f"{g.memory_used_peak_bytes / GiB:.1f}" if g.memory_used_peak_bytes is not None else "n/a",
             "verdict": first.get((g.node, g.index), "\u2013"),
             "idle": g.mean("kernel_active") is not None and 100.0 * g.mean("kernel_active") < never_used_pct}
            for g in fig.gpus]


def wrap(text: str, width: int = 78, indent: str = "") -> str:
    return "\n".join(textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=indent,
                                   break_on_hyphens=False, break_long_words=False))


def build_card(job: Job, fig: JobFigures, diag: Diagnosis, timelines: Sequence[Sequence[Any]],
               config: Any, *, optout_hint: bool = True) -> Card:
    """Render one job's card (HTML context, plain text, chart)."""
    rep = config.reports
    prices = fmt.Prices(rep.price_per_gpu_hour, rep.currency)
    label = job_label(job)
    name = clean(job.job_name, 60)
    primary = diag.primary
    verdicts = [{"title": v.title, "why": v.why, "advice": list(v.advice), "severity": v.severity,
                 "color": SEVERITY_COLORS.get(v.severity, "#333a44"), "bg": SEVERITY_BG.get(v.severity, "#f4f5f7")}
                for v in diag.verdicts]
    chart = charts.job_chart(timelines, fig.gpu_count)
    total_cost = _gpu_cost(fig, prices, "allocated") if prices.enabled else None
    details = [
        ("Job", label if label == str(job.job_id) else f"{label} (raw id {job.job_id})"),
        *([("Name", name)] if name else []),
        ("User / account", f"{clean(job.user) or 'n/a'} / {clean(job.account) or 'n/a'}"),
        ("Cluster / partition", f"{clean(job.cluster)} / {clean(job.partition) or 'n/a'}"),
        ("State", state_text(job)),
        ("Ran", f"{_when(job.start_time)} \u2192 {_when(job.end_time)} ({hms(fig.elapsed_s)})"),
        ("GPUs", f"{_gpus_line(job, fig)} on {clean(job.nodelist, 200) or 'n/a'}"),
        ("GPU-hours allocated", fmt.hours(fig.hours) + (f" ({prices.fmt(total_cost)})" if total_cost is not None
                                                         else "")),
        ("Peak GPU memory", _memory(fig)),
        ("Energy", energy(fig.energy_j) if fig.energy_j is not None
         else f"n/a ({fig.missing.get('energy_j') or 'not measured'})"),
    ]
    used_phrase = used_gpus_phrase(fig, float(config.analysis.never_used_kernel_pct))
    simulated = "simulated" in fig.backends
    contact = clean(rep.contact, 200)
    optout = (f"You get this card because the job used at least {rep.card_min_gpu_hours:g} GPU-hour"
              + ("" if rep.card_min_gpu_hours == 1 else "s")
              + (" and something could be improved" if rep.card_only_unhealthy else "")
              + ". To stop these cards, ask your cluster's support to run:") if optout_hint else ""
    optout_command = f"gpueff report optout {clean(job.user) or 'USER'}" if optout_hint else ""
    verdict_title = primary.title if primary else "no verdict"
    sm = fig.mean("sm_active")
    subject = f"[{clean(job.cluster, 40)}] GPU job {label}" + (f" \u201c{clean(name, 40)}\u201d" if name else "")
    subject += f": {verdict_title}" + (f", SM-active {fmt.pct(sm)}" if sm is not None else "")
    head = headline(fig, prices)
    split_rows = _split(fig, prices)
    ctx: dict[str, Any] = {
        "title": f"GPU efficiency of job {label}", "job_label": label, "name": name,
        "cluster": clean(job.cluster), "user": clean(job.user) or "n/a", "simulated": simulated,
        "sim_banner": SIM_BANNER, "headline": head, "verdicts": verdicts,
        "no_verdict": None if verdicts else (
            "No verdict: " + ("; ".join(s.reason for s in diag.skipped if s.name == "all") or
                              "no problem found in what was measured, but not every check could run, so "
                              "it is not called healthy.")),
        "byline": f"{dict(details)['User / account']} \u00b7 {dict(details)['Ran']}",
        "levels": _levels(fig), "hours": fmt.hours(fig.hours), "split": split_rows,
        "split_widths": list(zip(fmt.widths([r["hours"] for r in split_rows]), [r["color"] for r in split_rows],
                                 strict=True)),
        "split_reason": fig.waste.reason, "prices": prices.enabled,
        "cost_total": prices.fmt(total_cost) if prices.enabled else None,
        "efficiency": fmt.pct(fig.efficiency), "used_phrase": used_phrase,
        "gpu_rows": _gpu_rows(fig, diag, float(config.analysis.never_used_kernel_pct)) if fig.gpu_count > 1
        else [],
        "details": details, "not_assessed": _not_assessed(diag), "measured_by": measured_by(job, fig),
        "optout": optout, "optout_command": optout_command, "contact": contact,
        "chart_alt": "Kernel-active, SM-active and tensor-active over the job's time",
    }
    seff = render_card(job, fig, diag)
    # The terminal card is built from the same (sanitised-on-input) fields; strip control characters that
    # a job name could still carry into it.
    seff = "\n".join(_CONTROL.sub(" ", line) for line in seff.splitlines())
    cost_lines = []
    if prices.enabled:
        for row in ctx["split"]:
            cost_lines.append(f"  {row['label'] + ':':<24}{row['hours_text']:>9} GPU-h  {row['cost_text']:>12}")
    text = render("card.txt.j2", **ctx, headline_wrapped=wrap(head), seff=seff, cost_lines=cost_lines,
                  intro=wrap(f"Your Slurm job {label}" + (f" ({name})" if name else "") + f" on {ctx['cluster']}"
                             f" finished {_when(job.end_time)}. Here is how well it used its "
                             f"{'GPU' if fig.gpu_count == 1 else f'{fig.gpu_count} GPUs'}."),
                  optout_wrapped=wrap(optout) if optout else "", used_phrase_text=used_phrase or "")
    return Card(job=job, subject=subject, text=text, chart=chart, context=ctx)
