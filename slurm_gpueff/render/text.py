"""The seff-style text card of one job (wrapped at 80 columns), and a short table for many jobs.

Layout follows Slurm's ``seff`` (``Key: value`` lines), so its users read it without a manual; a figure
that was not measured reads ``n/a (<reason>)``, never 0.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Mapping, Sequence

from ..analysis.diagnose import Diagnosis
from ..analysis.figures import JobFigures
from ..analysis.precision import split
from ..fmt import energy, gib, gpu_hours, hms, job_label, pct, plural, sparkline, utc_seconds, watts
from ..readmodel import JobRow, Points

WIDTH = 80

SOURCES = {
    "nvml-gpm": "nvml-gpm (NVML GPM: SM, tensor and DRAM activity from the GPU's performance monitor)",
    "nvml": "nvml (NVML without GPM: kernel activity, memory and power only)",
    "dcgm": "dcgm (NVIDIA DCGM job statistics and profiling fields)",
    "simulated": "simulated (SIMULATED DATA \u2014 not a real GPU)",
    "none": "none (allocation only: no GPU data was collected)",
}
SIM_BANNER = "*** SIMULATED DATA \u2014 figures from simulated GPUs, not a real GPU ***"


def na(reason: str | None) -> str:
    return f"n/a ({reason or 'not measured'})"


class _Na:
    """``n/a (reason)``, or ``n/a (as above)`` when the reason repeats the previous line's."""

    def __init__(self) -> None:
        self.last: str | None = None

    def __call__(self, reason: str | None) -> str:
        reason = reason or "not measured"
        if reason == self.last:
            return "n/a (as above)"
        self.last = reason
        return na(reason)


PENDING_STATE = "Slurm's final state not read from accounting yet"
EPILOG_FINAL = "final: this site keeps no Slurm accounting"  # [sacct] accounting = false
ENDED = "ENDED"  # the job ended; which final state (COMPLETED, TIMEOUT, ...) only Slurm's accounting says


def final_state(job: JobRow) -> str | None:
    """Slurm's final state, None while only the hooks' record exists: the Epilog sees a TIMEOUT or a
    CANCELLED job exit 0 (checked on Slurm 22.05, 24.11 and 26.05), so its COMPLETED / FAILED is a guess
    that only enrichment from sacct replaces with the real state."""
    return job.state if job.enriched else None


def state_word(job: JobRow) -> str:
    """The one word every display uses for a job's state: RUNNING, Slurm's final state once accounting
    was read, ENDED before (the Epilog saw the job end, but a TIMEOUT or CANCELLED job exits 0 there too)."""
    if is_live(job):
        return "RUNNING"
    if not job.enriched:
        return ENDED
    return job.state or "unknown"


def is_live(job: JobRow) -> bool:
    """A running job's row: its figures so far, from the latest live record (slurm_gpueff/live.py)."""
    return job.live


def state_text(job: JobRow, accounting: bool = True) -> str:
    """``COMPLETED (exit code 0)``, ``RUNNING (figures so far, as of ...)``, or ``ENDED`` with what the
    Epilog saw: pending Slurm's final state, or final where the site keeps no accounting (``accounting``
    false)."""
    if is_live(job):
        return f"RUNNING (figures so far, as of {utc_seconds(job.end_time)})"
    if job.signal:
        detail = f"killed by signal {job.signal}"
    elif job.exit_code is not None:
        detail = f"exit code {job.exit_code}"
    else:
        detail = None
    state = final_state(job)
    if state:
        return f"{state} ({detail})" if detail else state
    if not job.enriched:
        seen = f"signal {job.signal}" if job.signal else detail
        why = PENDING_STATE if accounting else EPILOG_FINAL
        return f"{ENDED} (the Epilog saw {seen}; {why})" if seen else f"{ENDED} ({why})"
    if job.signal:
        return na(f"{detail}; the final state comes from sacct, not fetched yet")
    return na("not recorded yet; it comes from sacct")


def _wrap(text: str, indent: str = "", first: str | None = None) -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent if first is None else first,
                         subsequent_indent=indent, break_on_hyphens=False, break_long_words=False) or [""]


def _line(key: str, value: str) -> list[str]:
    return _wrap(f"{key}: {value}", indent="    ", first="")


def _figure(fig: JobFigures, metric: str, na_: _Na) -> str:
    """A job-level fraction; notes partial coverage (``measured on 3 of 4 GPUs``) after the value."""
    value, missing = fig.mean(metric), fig.missing.get(metric)
    if value is None:
        return na_(missing)
    return f"{pct(value)} (n/a: {missing})" if missing else pct(value)


def gpus_line(job: JobRow, fig: JobFigures, times: str = "x") -> str:
    """``2 x A100, 1 x H100``: the GPUs per model (the job's GPU type where a GPU has none)."""
    if not fig.gpus:
        return f"{job.gpu_count} {times} {job.gpu_type or 'unknown model'}" if job.gpu_count else "0"
    counts = Counter(g.model or job.gpu_type or "unknown model" for g in fig.gpus)
    text = ", ".join(f"{n} {times} {m}" for m, n in counts.items())
    shared = [f"{g.shards} of {g.shard_count or '?'} shards" for g in fig.gpus if g.shards]
    return f"{text}, shared ({'; '.join(shared)})" if shared else text


def shared_lines(fig: JobFigures) -> list[tuple[str, str]]:
    """One ``Shared GPU`` line per GPU that other jobs held too and whose part of it was measured: with whom,
    this job's share and its own part of the GPU's time, what no job accounted for, and how it was measured."""
    out = []
    one_node = len({g.node for g in fig.gpus}) == 1
    for g in fig.gpus:
        sh = g.shared
        if not sh:
            continue
        others = list(sh.others)
        more = (sh.with_count or len(others)) - len(others)
        whom = ", ".join(others) + (f" and {more} more" if more > 0 else "")
        k = (g.own or {}).get("kernel_active")
        parts = [f"with job{'s' if len(others) + max(more, 0) > 1 else ''} {whom or 'n/a'}",
                 f"this job's share {pct(g.share)}" if g.share is not None else "this job's share n/a"]
        if k is not None:
            parts.append(f"its kernels ran {pct(k)} of the GPU's time, {pct(g.mean('kernel_active'))} of its share")
        if sh.unmeasured_s is not None and sh.unmeasured_s > 0:
            parts.append(f"its own part could not be measured for {hms(sh.unmeasured_s)} (MPS)")
        if sh.unattributed is not None and sh.unattributed > 0:
            parts.append(f"{pct(sh.unattributed)} of the GPU's kernel time was no running job's")
        label = f"GPU {g.index}" if one_node else g.label
        out.append((f"Shared {label}", f"{'; '.join(parts)}. The activity figures are this job's own part, "
                    f"relative to its share ({sh.method or 'measured per job'})."))
    return out


def _nodes_line(job: JobRow, fig: JobFigures) -> str:
    nodes = list(dict.fromkeys(g.node for g in fig.gpus))
    if not nodes:
        return job.nodelist or "n/a"
    return f"{len(nodes)} ({job.nodelist or ','.join(nodes)})"


def _memory(fig: JobFigures, na_: _Na) -> str:
    used, total = fig.memory_used_peak_bytes, fig.memory_total_bytes
    if used is None:
        return na_(fig.missing.get("memory"))
    where = " on the fullest GPU" if fig.gpu_count > 1 else ""
    if not total:
        return f"{gib(used)} GiB{where} (GPU memory size {na(fig.missing.get('memory'))})"
    note = f"; n/a: {fig.missing['memory']}" if fig.missing.get("memory") else ""
    return f"{gib(used)} of {gib(total)} GiB{where} ({pct(fig.memory_fraction)}{note})"


def _energy(fig: JobFigures, na_: _Na) -> str:
    text = na_(fig.missing.get("energy_j")) if fig.energy_j is None else energy(fig.energy_j)
    if fig.power_mean_w is not None:
        per = " per GPU" if fig.gpu_count > 1 else ""
        text += f", mean power {watts(fig.power_mean_w)}{per}"
    elif fig.energy_j is not None:
        text += f", mean power {na(fig.missing.get('power_mean_w'))}"
    return text


def _split(fig: JobFigures, na_: _Na) -> list[str]:
    w = fig.waste
    if w.idle_h is None and w.underfilled_h is None and w.sm_active_h is None:
        return _line("GPU-hours split", na_(w.reason))
    out = ["GPU-hours split:"]
    rows = (("idle (no kernel running)", w.idle_h), ("busy, SMs not active", w.underfilled_h),
            ("SM-active", w.sm_active_h))
    for label, hours in rows:
        if hours is None:
            out += _wrap(f"{label + ':':<28}{na_(w.reason)}", indent=" " * 30, first="  ")
        else:
            share = pct(hours / fig.hours) if fig.hours else "n/a"
            out.append(f"  {label + ':':<28}{gpu_hours(hours):>9} GPU-h  {share:>6}")
    return out


def _verdicts(diag: Diagnosis) -> list[str]:
    out: list[str] = []
    if not diag.verdicts:
        if any(s.name == "all" for s in diag.skipped):
            out.append("Verdict: none")
        else:
            out += _wrap("Verdict: none (no problem found in what was measured, but not every check could "
                         "run, so it is not called healthy)", indent="  ", first="")
    for n, v in enumerate(diag.verdicts):
        out.append(f"Verdict: {v.title}" if n == 0 else f"Also: {v.title}")
        out += _wrap(v.why, indent="  ")
        out.append("  Things to try:")
        for a in v.advice:
            out += _wrap(a, indent="      ", first="    - ")
    groups: dict[str, tuple[list[str], list[str]]] = {}  # detail -> (check titles, figures)
    for s in diag.not_assessed:
        titles, figs = groups.setdefault(s.detail or s.reason, ([], []))
        titles.append(s.title)
        if s.figure and s.figure not in figs:
            figs.append(s.figure)
    for detail, (titles, figs) in groups.items():
        why = f"{', '.join(figs)} not measured: {detail}" if figs else detail
        if detail == "not measured" and figs:
            why = f"{', '.join(figs)} not measured"
        out += _wrap(f"Not assessed: {', '.join(titles)} ({why})", indent="  ")
    return out


def _gpu_rows(fig: JobFigures, diag: Diagnosis) -> list[str]:
    first = diag.gpu_verdicts()
    labels = [g.label for g in fig.gpus]
    lw = max(6, *(len(x) for x in labels))
    out = ["Per GPU:", f"  {'GPU':<{lw}} {'GPU-h':>6} {'kernel':>6} {'SM':>6} {'tensor':>6} {'DRAM':>6}"
           f" {'mem GiB':>8}  verdict"]
    for g in fig.gpus:
        f = [pct(g.mean(m)) for m in ("kernel_active", "sm_active", "tensor_active", "dram_active")]
        out.append(f"  {g.label:<{lw}} {gpu_hours(g.hours):>6} {f[0]:>6} {f[1]:>6} {f[2]:>6} {f[3]:>6}"
                   f" {gib(g.memory_used_peak_bytes):>8}  {first.get((g.node, g.index), '-')}")
    return out


def note(job: JobRow, fig: JobFigures) -> str | None:
    """The job's stored reason (what the hooks, the collector or Slurm's accounting said about it: a node that
    failed, a Prolog state lost, who cancelled it and why), unless the Measured by line says it already."""
    if not job.reason or "none" in (fig.backends or [job.backend or "none"]):
        return None
    return str(job.reason)


def measured_by(job: JobRow, fig: JobFigures) -> list[str]:
    """One phrase per backend that measured the job (with its sample count), for the card and the mail."""
    out: list[str] = []
    for b in fig.backends or [job.backend or "none"]:
        text = SOURCES.get(b, b)
        if b == "none" and job.reason:
            text = f"none (allocation only: {job.reason})"
        samples = sum(g.samples for g in fig.gpus if g.source == b)
        if b == "nvml" and not samples:  # not "without GPM": nothing at all was measured, say why
            why = next((r for g in fig.gpus if g.source == b and (r := g.missing.get("kernel_active"))), None)
            text = f"nvml (the gpueff node agent measured nothing: {why or job.reason or 'no reading'})"
        if samples and b != "none":
            text += f", {plural(samples, 'sample')}"
        out.append(text)
    return out


Runs = Sequence[tuple[JobRow, JobFigures]]  # a requeued job's runs, in order, the card's own last


def runs_line(runs: Runs) -> str:
    """``requeued once: 2 runs, 0.40 + 1.20 GPU-h (1.60 in all)``: every run's GPU-hours, n/a with the reason
    where a run's are unknown; the card's other figures are the last run's."""
    n = len(runs)
    times = {2: "once", 3: "twice"}.get(n, f"{n - 1} times")
    hours = [f.hours for _j, f in runs]
    parts = " + ".join(gpu_hours(h) if h is not None else na(f.missing.get("gpu_hours")) for (_j, f), h
                       in zip(runs, hours, strict=True))
    known = [h for h in hours if h is not None]
    total = (f"{gpu_hours(sum(known))} in all" if len(known) == n
             else f"{gpu_hours(sum(known))} in the {len(known)} runs known" if known else "")
    notes = [total] if total else []
    if any(j.run < 0 for j, _f in runs):
        notes.append("run order pending accounting")
    notes.append("the figures below are the last run's")
    return f"requeued {times}: {n} runs, {parts} GPU-h ({'; '.join(notes)})"


# A GPU's coarse timeline by (node, GPU index): [[t_s since the job's start, kernel, SM, tensor], ...], fractions
# or None (job_gpu_timeline). A GPU without one (none recorded, or retention deleted it) is absent.
Timelines = Mapping[tuple[str, int], Points]
SPARK_WIDTH = 40
SPARK_GPUS = 8  # more GPUs: the first ones and a count, so a big job's card stays readable


def activity_lines(fig: JobFigures, timelines: Timelines) -> list[str]:
    """``SM activity over 02:14:05: ▁▂▇██▇…  (GPU 0)`` per GPU with a timeline: when the job worked, which
    the means cannot say (a slow start, a stall, a GPU that stopped). Kernel activity where no GPU measured
    SM activity (NVML without GPM). No timeline, no line: never one made up from the means."""
    have = [(g, tl) for g in fig.gpus if (tl := timelines.get((g.node, g.index)))]
    col, name = next(((c, n) for c, n in ((2, "SM"), (1, "Kernel")) if any(
        len(p) > c and p[c] is not None for _g, tl in have for p in tl)), (0, ""))
    if not col:
        return []
    span = fig.elapsed_s or max(float(p[0]) for _g, tl in have for p in tl if p and p[0] is not None)
    one_node = len({g.node for g in fig.gpus}) == 1
    labels = [f"GPU {g.index}" if one_node else g.label for g, _tl in have]
    out = []
    for (_g, tl), label in zip(have[:SPARK_GPUS], labels, strict=False):
        cells = sparkline([(p[0], p[col] if len(p) > col else None) for p in tl if p and p[0] is not None],
                          span, SPARK_WIDTH)
        if cells:
            out.append(f"{name} activity over {hms(span)}: {cells}  ({label})")
    if out and len(have) > SPARK_GPUS:
        out.append(f"  \u2026 {len(have) - SPARK_GPUS} more GPUs")
    return out


def render_card(job: JobRow, fig: JobFigures, diag: Diagnosis, runs: Runs = (),
                timelines: Timelines | None = None, accounting: bool = True) -> str:
    """The card of one job, as printed by ``seff-gpu``; with ``runs`` (a requeued job's, this one last) a
    Runs line after the GPU-hours; with ``timelines``, a line of activity over time per GPU; ``accounting``
    false where the site keeps no Slurm accounting (:func:`state_text`)."""
    lines: list[str] = []
    if "simulated" in fig.backends:
        lines.append(SIM_BANNER)
    na_ = _Na()
    kernel = _figure(fig, "kernel_active", na_)
    if fig.mean("kernel_active") is not None:
        kernel += "  (nvidia-smi's \"GPU utilization\")"
    sm = _figure(fig, "sm_active", na_)
    if fig.mean("sm_active") is not None:
        eff = pct(fig.efficiency)
        if fig.efficiency is None:
            eff = f"n/a, {fig.missing.get('efficiency', 'not measured')}"
        sm += f"  (efficiency SM/kernel: {eff})"
    jid = job_label(job)
    fields = [
        ("Job ID", jid if jid == str(job.job_id) else f"{jid} (raw id {job.job_id})"),
        ("Cluster", job.cluster), ("User/Account", f"{job.user or 'n/a'}/{job.account or 'n/a'}"),
        ("State", state_text(job, accounting)), ("Partition", job.partition or "n/a"),
        ("Nodes", _nodes_line(job, fig)),
        ("GPUs", gpus_line(job, fig)), *shared_lines(fig), ("Elapsed", hms(fig.elapsed_s)),
        ("GPU-hours allocated", gpu_hours(fig.hours) if fig.hours is not None else na(fig.missing.get("gpu_hours"))),
        *([("Runs", runs_line(runs))] if len(runs) > 1 else []),
        ("Kernel-active", kernel), ("SM-active", sm),
        ("Tensor-active", _figure(fig, "tensor_active", na_) + _tensor_split(fig)),
        ("DRAM-active", _figure(fig, "dram_active", na_)),
        ("Peak GPU memory", _memory(fig, na_)), ("Energy", _energy(fig, na_)),
        *([("CPU", cpu)] if (cpu := cpu_line(fig)) else []),
        *([("Coverage", fig.coverage_note)] if fig.coverage_note else []),
        *([("Note", text)] if (text := note(job, fig)) else []),
    ]
    for key, value in fields:
        lines += _line(key, value)
    lines += _split(fig, na_)
    lines += _verdicts(diag)
    if fig.gpu_count > 1:
        lines += _gpu_rows(fig, diag)
    lines += activity_lines(fig, timelines or {})
    for text in measured_by(job, fig):
        lines += _line("Measured by", text)
    return "\n".join(lines)


def cpu_line(fig: JobFigures) -> str | None:
    """``efficiency 93.0% of 8 CPUs (TotalCPU 02:10:05), peak host memory 12.3 GiB``, n/a parts with why.
    Both unknown: one phrase, "not known yet" until Slurm's accounting is read; None (no line) where the
    accounting has been read and holds neither, or where the site keeps none (analysis.cpu.NO_ACCOUNTING),
    since they can then never be known."""
    from ..analysis.cpu import PENDING

    c = fig.cpu
    if c.efficiency is None and c.max_rss_bytes is None:
        if c.missing.get("cpu_efficiency") == c.missing.get("max_rss_bytes") == PENDING:
            return "not known yet: CPU time and peak host memory come from Slurm's accounting, read after the job"
        if "cpu_efficiency" in c.missing and "max_rss_bytes" in c.missing:
            return None
    eff = (f"efficiency {pct(c.efficiency)} of {c.alloc_cpus} CPUs (TotalCPU {hms(c.total_cpu_s)})"
           if c.efficiency is not None else f"efficiency {na(c.missing.get('cpu_efficiency'))}")
    rss = (f"peak host memory {gib(c.max_rss_bytes)} GiB" if c.max_rss_bytes is not None
           else f"peak host memory {na(c.missing.get('max_rss_bytes'))}")
    return f"{eff}, {rss}"


def _tensor_split(fig: JobFigures) -> str:
    """``  (FP64 DFMA 81.0%)``: which precision's tensor pipes worked, where measured."""
    parts = split(fig.means) if fig.mean("tensor_active") else None
    return f"  ({parts})" if parts else ""


def render_table(items: Sequence[tuple[JobRow, JobFigures, Diagnosis]]) -> str:
    """One line per job (for an array with many tasks): id, state, GPU-hours, k, s, primary verdict."""
    head = f"{'Job ID':<14} {'State':<10} {'GPUs':>4} {'GPU-h':>7} {'kernel':>6} {'SM':>6}  verdict"
    out = [head, "-" * len(head)]
    for job, fig, diag in items:
        v = diag.primary
        state = state_word(job)
        out.append(f"{job_label(job):<14} {state[:10]:<10} {fig.gpu_count:>4} {gpu_hours(fig.hours):>7} "
                   f"{pct(fig.mean('kernel_active')):>6} {pct(fig.mean('sm_active')):>6}  "
                   f"{(v.title if v else 'none')[:36]}")
    return "\n".join(out)

