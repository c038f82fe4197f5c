"""The idle-GPU policy's decisions for running jobs: pure functions from what was seen to plain data.

A GPU is judged over the last ``[alerts] window_min`` only, never the whole job (a mean over the job hides
a job that goes idle late): the difference of two of its cumulative live samples, the newest and the
newest one at least a window older (or the job's start), gives its exact kernel and SM activity over that
window. It is idle when kernel activity is under ``kernel_pct`` and SM activity under ``sm_pct``; SM
activity sees what kernel activity cannot (a kernel spinning on one SM, or memory held with little
compute, reads as busy kernels with idle SMs). Without SM activity (no GPM) the kernel figure alone
decides, and the decision says so. A job is idle when every GPU it holds is; a window measured for less
than ``min_coverage_pct`` of its length (agent down, the service just started) decides nothing.

The steps for an idle job, each at most once: a warning, a second warning ``warn_again_min`` later, then,
``cancel_after_min`` after that and only with ``cancel = true``, the cancel; without it the audit notes
once that it would have cancelled (and a site that turns ``cancel`` on later cancels at the next pass).
A job that is no longer idle after a warning is noted as recovered and starts over. Exempt jobs
(interactive, allowlists) and jobs within ``grace_min`` of their start are not judged. Service/alerts.py
gathers the inputs, performs the actions and writes the audit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..config import AlertsConfig

# The audit's actions (alert_log.action)
WARN, WARN_AGAIN, CANCEL, WOULD_CANCEL = "warn", "warn_again", "cancel", "would_cancel"
EXEMPT, RECOVERED, RATE_LIMITED = "exempt", "recovered", "rate_limited"
MAILS = (WARN, WARN_AGAIN)


@dataclass(frozen=True)
class Sample:
    """One GPU's cumulative figures at one live record (models.LiveSample)."""

    as_of: datetime
    covered_s: float
    kernel_s: float | None
    sm_s: float | None


@dataclass(frozen=True)
class GpuWindow:
    """A GPU's means over the window, and how much of the window was measured."""

    node: str
    index: int
    covered_s: float
    kernel: float | None
    sm: float | None

    def describe(self) -> str:
        sm = f"SM {100 * self.sm:.2f} %" if self.sm is not None else "SM n/a (no GPM: judged on kernel activity)"
        k = f"kernel {100 * self.kernel:.1f} %" if self.kernel is not None else "kernel n/a"
        span = f"{self.covered_s:.0f} s" if self.covered_s < 120 else f"{self.covered_s / 60:.1f} min"
        return f"GPU {self.index} on {self.node}: {k}, {sm} over {span} measured"


@dataclass(frozen=True)
class RunningJob:
    """What the policy knows of a running job: its identity, Slurm's view (squeue), and its GPUs' samples."""

    cluster: str
    job_id: int
    run: int
    user: str | None
    account: str | None
    start: datetime | None
    as_of: datetime
    partition: str | None = None
    qos: str | None = None
    interactive: bool | None = None
    samples: dict[tuple[str, int], list[Sample]] = field(default_factory=dict)


@dataclass(frozen=True)
class Past:
    """An earlier audit row of the same job. ``delivered``: for a warning, whether it reached the owner (a
    warning that failed to send is no warning: it is tried again, and nothing counts on it)."""

    at: datetime
    action: str
    delivered: bool = True


@dataclass(frozen=True)
class Decision:
    """What to do about one job now (``action`` None: nothing), and what was seen."""

    action: str | None
    detail: str
    idle: bool = False


def window_base(samples: Sequence[Sample], minutes: float) -> Sample | None:
    """The sample a window over the last ``minutes`` starts from: the newest one at least ``minutes`` older
    than the newest; None where none is that old. It only moves forward as samples come, so every sample
    older than it is of no use to a later window either."""
    edge = max(x.as_of for x in samples) - timedelta(minutes=minutes)
    older = [x for x in samples if x.as_of <= edge]
    return max(older, key=lambda x: x.as_of) if older else None


def window(samples: Sequence[Sample], start: datetime | None, minutes: float, node: str, index: int) -> GpuWindow:
    """The GPU's means over the last ``minutes`` before its newest sample."""
    s = sorted(samples, key=lambda x: x.as_of)
    new = s[-1]
    edge = new.as_of - timedelta(minutes=minutes)
    base = window_base(s, minutes)
    if base is None and start is not None and start >= edge:  # the job is younger than the window: from its start
        base = Sample(start, 0.0, 0.0, 0.0)
    elif base is None:  # samples began inside the window (the service started lately): what they cover
        base = s[0]
    cov = new.covered_s - base.covered_s

    def mean(a: float | None, b: float | None) -> float | None:
        return (a - b) / cov if a is not None and b is not None and cov > 0 else None

    return GpuWindow(node, index, max(cov, 0.0), mean(new.kernel_s, base.kernel_s), mean(new.sm_s, base.sm_s))


def exemption(job: RunningJob, cfg: AlertsConfig) -> str | None:
    """Why the job is never judged, or None."""
    if cfg.exempt_interactive and job.interactive:
        return "interactive job (salloc / srun without a batch script)"
    for what, value, allowed in (("user", job.user, cfg.exempt_users), ("account", job.account, cfg.exempt_accounts),
                                 ("partition", job.partition, cfg.exempt_partitions), ("QOS", job.qos, cfg.exempt_qos)):
        if value is not None and value in allowed:
            return f"{what} {value} is exempt ([alerts] exempt_{'qos' if what == 'QOS' else what + 's'})"
    return None


def judge(job: RunningJob, cfg: AlertsConfig) -> tuple[bool | None, str]:
    """(idle?, what was seen); None: not enough measured to say."""
    wins = [window(v, job.start, cfg.window_min, node, idx) for (node, idx), v in sorted(job.samples.items()) if v]
    if not wins:
        return None, "no live figures of its GPUs yet"
    need = cfg.window_min * 60 * cfg.min_coverage_pct / 100
    seen = "; ".join(w.describe() for w in wins)
    if any(w.covered_s < need for w in wins):
        return None, f"window not measured enough (need {need / 60:.0f} of {cfg.window_min:g} min): {seen}"

    def idle(w: GpuWindow) -> bool:
        return (w.kernel is not None and w.kernel < cfg.kernel_pct / 100
                and (w.sm is None or w.sm < cfg.sm_pct / 100))

    return all(idle(w) for w in wins), seen


def decide(job: RunningJob, past: Sequence[Past], cfg: AlertsConfig, now: datetime) -> Decision:
    """The next step for ``job`` given its audit so far (oldest first)."""
    if now - job.as_of > timedelta(minutes=cfg.stale_min):
        return Decision(None, f"live figures stale (as of {job.as_of:%Y-%m-%d %H:%M} UTC)")
    why = exemption(job, cfg)
    if why is not None:
        noted = any(p.action == EXEMPT for p in past)
        return Decision(None if noted else EXEMPT, why)
    if job.start is not None and now - job.start < timedelta(minutes=cfg.grace_min):
        return Decision(None, f"within the grace period ({cfg.grace_min:g} min from the job's start)")
    idle, seen = judge(job, cfg)
    # the steps since the job last recovered
    since = [p for p in past if p.action in (WARN, WARN_AGAIN, WOULD_CANCEL, CANCEL, RECOVERED)
             and (p.delivered or p.action not in MAILS)]  # the owner was never warned by a failed mail
    last_reset = max((i for i, p in enumerate(since) if p.action == RECOVERED), default=-1)
    steps = since[last_reset + 1:]
    if idle is None:
        return Decision(None, seen)
    if not idle:
        return Decision(RECOVERED if steps else None, seen)
    done = [p.action for p in steps]
    last = max((p.at for p in steps if p.action in MAILS), default=None)  # the last warning
    if WARN not in done:
        return Decision(WARN, seen, idle=True)
    if WARN_AGAIN not in done:
        due = last is not None and now - last >= timedelta(minutes=cfg.warn_again_min)
        return Decision(WARN_AGAIN if due else None, seen, idle=True)
    if CANCEL in done or (WOULD_CANCEL in done and not cfg.cancel):
        return Decision(None, seen, idle=True)
    if last is not None and now - last >= timedelta(minutes=cfg.cancel_after_min):
        return Decision(CANCEL if cfg.cancel else WOULD_CANCEL, seen, idle=True)
    return Decision(None, seen, idle=True)
