"""Prometheus ``/metrics``: per-account (and, where a site asks, per-user) GPU-hour counters and jobs by verdict.

A user's GPU-hours and waste are theirs: the per-user series exist only with ``[service] metrics_per_user =
true``, and ``[service] metrics_token_file`` makes the endpoint answer only a scrape that sends that bearer
token (Prometheus ``authorization: {credentials_file: ...}``); any local user can reach 127.0.0.1.

Read at scrape time from the month rows of ``usage_rollup`` (a few thousand rows at most), so a scrape
costs one small GROUP BY, not a scan of the jobs. Counters are all-time totals (they only grow, except
when a job is re-analysed with smaller figures: Prometheus treats that as a reset).

Label cardinality is bounded: no job labels; accounts and users are capped to the top
``service.metrics_top_accounts`` / ``service.metrics_top_users`` by allocated GPU-hours, the rest summed
under ``other``; an unknown user or account reads ``unknown``. A figure nobody measured has no sample
(never a 0). ``wasted`` = idle + underfilled over the GPU-hours where those were measured; the
``*_measured`` counters give that coverage.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlmodel import col

from .. import spool
from ..access.scrape import serve as serve  # the scheduler's name for it: the one guarded /metrics server
from ..config import Config
from ..models import UsageRollup
from .tasks import Context

OTHER = "other"
UNKNOWN = "unknown"
# metric suffix -> (rollup measure(s), help)
FIGURES: dict[str, tuple[tuple[str, ...], str]] = {
    "gpu_hours_allocated": (("gpu_hours",), "GPU-hours allocated to finished jobs"),
    "gpu_hours_sm_active": (("sm_active_gpu_hours",), "SM-active GPU-hours (GPM; where measured)"),
    "gpu_hours_tensor_active": (("tensor_active_gpu_hours",), "Tensor-active GPU-hours (where measured)"),
    "gpu_hours_idle": (("idle_gpu_hours",), "GPU-hours with no kernel running (where measured)"),
    "gpu_hours_underfilled": (("underfilled_gpu_hours",), "GPU-hours busy but SMs not active (where measured)"),
    "gpu_hours_wasted": (("idle_gpu_hours", "underfilled_gpu_hours"),
                         "Idle + underfilled GPU-hours (where measured)"),
    "gpu_hours_kernel_measured": (("kernel_measured_gpu_hours",), "GPU-hours with kernel activity measured"),
    "gpu_hours_sm_measured": (("sm_measured_gpu_hours",), "GPU-hours with SM activity measured"),
}
MEASURES = sorted({m for ms, _h in FIGURES.values() for m in ms})


def _capped(rows: list[Any], key: str, top: int) -> tuple[dict[tuple[str, str, str], int],
                                                          dict[tuple[str, str], dict[str, float]]]:
    """Jobs by (cluster, name, verdict) and measure sums by (cluster, name); names outside the top ``top``
    by GPU-hours are folded into OTHER."""
    totals: dict[tuple[str, str], float] = defaultdict(float)
    for r in rows:
        totals[(r.cluster, getattr(r, key) or UNKNOWN)] += float(r.gpu_hours or 0.0)
    keep = {k for k, _v in sorted(totals.items(), key=lambda kv: (-kv[1], kv[0]))[:max(0, top)]}
    jobs: dict[tuple[str, str, str], int] = defaultdict(int)
    sums: dict[tuple[str, str], dict[str, float]] = defaultdict(dict)
    for r in rows:
        name = getattr(r, key) or UNKNOWN
        if (r.cluster, name) not in keep:
            name = OTHER
        jobs[(r.cluster, name, r.verdict or "none")] += int(r.jobs or 0)
        acc = sums[(r.cluster, name)]
        for m in MEASURES:
            if getattr(r, m) is not None:
                acc[m] = acc.get(m, 0.0) + float(getattr(r, m))
    return jobs, sums


class UsageCollector(Collector):
    """A prometheus_client collector over the rollups (and the service's own task bookkeeping)."""

    def __init__(self, engine: Any, config: Config, ctx: Context | None = None):
        self.engine, self.config, self.ctx = engine, config, ctx

    def _rows(self, key: str) -> list[Any]:
        r = UsageRollup
        stmt = (select(col(r.cluster), getattr(r, key), col(r.verdict), func.sum(r.jobs).label("jobs"),
                       *[func.sum(getattr(r, m)).label(m) for m in MEASURES])
                .where(col(r.period) == "month").group_by(col(r.cluster), getattr(r, key), col(r.verdict)))
        with self.engine.connect() as conn:
            return list(conn.execute(stmt))

    def collect(self) -> Iterator[Any]:
        s = self.config.service
        try:
            groups = {"account": _capped(self._rows("account"), "account", s.metrics_top_accounts)}
            if s.metrics_per_user:
                groups["user"] = _capped(self._rows("user"), "user", s.metrics_top_users)
        except Exception:  # noqa: BLE001 - a scrape must answer even with the database down
            groups = {}
        yield GaugeMetricFamily("gpueff_database_up", "1 if the last scrape could read the job database",
                                value=1 if groups else 0)
        for scope, (jobs, sums) in groups.items():
            prefix = "gpueff" if scope == "account" else "gpueff_user"
            fam = CounterMetricFamily(f"{prefix}_jobs", f"Finished jobs by {scope} and primary verdict",
                                      labels=["cluster", scope, "verdict"])
            for labels, n in sorted(jobs.items()):
                fam.add_metric(list(labels), n)
            yield fam
            for suffix, (measures, text) in FIGURES.items():
                fam = CounterMetricFamily(f"{prefix}_{suffix}", f"{text}, by {scope}", labels=["cluster", scope])
                for (cluster, name), acc in sorted(sums.items()):
                    known = [acc[m] for m in measures if m in acc]
                    if known:
                        fam.add_metric([cluster, name], sum(known))
                yield fam
        yield from self._service()

    def _service(self) -> Iterator[Any]:
        spool_dir = self.config.paths.spool_dir
        pending = GaugeMetricFamily("gpueff_spool_pending_records", "Records waiting in this host's spool")
        with contextlib.suppress(OSError):
            pending.add_metric([], sum(1 for n in os.listdir(spool.incoming_dir(spool_dir))
                                       if n.endswith(".json")))
        yield pending
        if self.ctx is None:
            return
        for outcome, verb, times in (("success", "succeeded", self.ctx.last_ok),
                                     ("failure", "failed", self.ctx.last_error)):
            fam = GaugeMetricFamily(f"gpueff_task_last_{outcome}_timestamp_seconds",
                                    f"When a scheduled task last {verb}", labels=["task"])
            for name, t in sorted(times.items()):
                fam.add_metric([name], t)
            yield fam
        from .taskhealth import report

        health = report(self.ctx)
        late = GaugeMetricFamily("gpueff_task_late_seconds", "How long a scheduled task has been due without "
                                 "starting (0 on time; by the monotonic clock)", labels=["task"])
        for line in health["tasks"]:
            late.add_metric([line["task"]], line["late_s"])
        yield late
        yield CounterMetricFamily("gpueff_clock_steps", "Steps of the wall clock the scheduler put its tasks "
                                  "back on time after", value=health["clock_steps"])
        yield GaugeMetricFamily("gpueff_service_scrape_timestamp_seconds", "Time of this scrape", value=time.time())


def registry_for(engine: Any, config: Config, ctx: Context | None = None) -> Any:
    reg = CollectorRegistry()
    reg.register(UsageCollector(engine, config, ctx))
    return reg
