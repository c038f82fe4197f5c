"""The monthly GPU-hour waste summary for a research lead (one account) or the site (all accounts).

Figures come from the per-job summary columns (``job.gpu_hours``, ``idle_gpu_hours``, ...; written by
:mod:`slurm_gpueff.summarize`) through SQL aggregates (GROUP BY in the database, no per-job Python loop),
so a month of a large site stays fast on SQLite and PostgreSQL. A job belongs to the month in which it
*ended* (UTC). Jobs whose activity was not measured add to "allocated" and to "not measured", never to
idle or active: a sum over unknown parts is not invented. Money needs ``reports.price_per_gpu_hour``;
GPU-hours are grouped by GPU model in SQL and priced per model here.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Float, case, cast, func
from sqlmodel import Session, col, select

from ..analysis.verdicts import RULES
from ..models import Job
from . import charts, fmt
from .card import clean
from .templates import render, templates_dir

PARTS = ("allocated", "idle", "underfilled", "active", "tensor", "unmeasured")
LABELS = {r.name: r.label for r in RULES}
ORDER = {r.name: n for n, r in enumerate(RULES)}


def month_bounds(month: str) -> tuple[datetime, datetime]:
    """``"2026-11"`` -> (2026-11-01, 2026-12-01), naive UTC. ValueError on a bad month."""
    try:
        start = datetime.strptime(month, "%Y-%m")
    except ValueError:
        raise ValueError(f"month {month!r} is not YYYY-MM") from None
    end = start.replace(year=start.year + 1, month=1) if start.month == 12 else start.replace(month=start.month + 1)
    return start, end


def previous_month(month: str) -> str:
    start, _ = month_bounds(month)
    return f"{start.year - 1}-12" if start.month == 1 else f"{start.year}-{start.month - 1:02d}"


def month_title(month: str) -> str:
    return month_bounds(month)[0].strftime("%B %Y")


def _sums() -> list[Any]:
    """SUM columns of the split; ``unmeasured`` = allocated hours of jobs without an SM-active split."""
    return [
        func.count().label("jobs"),
        func.sum(Job.gpu_hours).label("allocated"),
        func.sum(Job.idle_gpu_hours).label("idle"),
        func.sum(Job.underfilled_gpu_hours).label("underfilled"),
        func.sum(Job.sm_active_gpu_hours).label("active"),
        func.sum(Job.tensor_active_gpu_hours).label("tensor"),
        func.sum(case((col(Job.sm_active_gpu_hours).is_(None), Job.gpu_hours), else_=cast(0.0, Float)))
        .label("unmeasured"),
    ]


def _where(start: datetime, end: datetime, account: str | None) -> list[Any]:
    cond = [col(Job.end_time) >= start, col(Job.end_time) < end, col(Job.gpu_hours).is_not(None)]
    if account is not None:
        cond.append(Job.account == account)
    return cond


@dataclass
class Totals:
    """GPU-hours of one group (the month, a user, an account) and their cost per part."""

    jobs: int = 0
    hours: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))
    cost: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(PARTS, 0.0))

    def add(self, row: Any, prices: fmt.Prices, model: str | None) -> None:
        self.jobs += int(row.jobs or 0)
        for p in PARTS:
            h = float(getattr(row, p) or 0.0)
            self.hours[p] += h
            c = prices.cost(h, model) if prices.enabled else None
            self.cost[p] = None if c is None or self.cost[p] is None else self.cost[p] + c  # type: ignore[operator]

    @property
    def wasted(self) -> float:
        return self.hours["idle"] + self.hours["underfilled"]

    @property
    def wasted_cost(self) -> float | None:
        a, b = self.cost["idle"], self.cost["underfilled"]
        return None if a is None or b is None else a + b

    def share(self, part: str) -> float | None:
        return fmt.share(self.hours[part], self.hours["allocated"])

    @property
    def measured(self) -> float:
        return self.hours["allocated"] - self.hours["unmeasured"]

    def measured_share(self, part: str) -> float | None:
        """Share of the *measured* GPU-hours (the unmeasured ones have no split)."""
        return fmt.share(self.hours[part], self.measured)


def totals(session: Session, start: datetime, end: datetime, account: str | None, prices: fmt.Prices) -> Totals:
    stmt = select(Job.gpu_type, *_sums()).where(*_where(start, end, account)).group_by(Job.gpu_type)
    t = Totals()
    for row in session.exec(stmt).all():  # type: ignore[call-overload]
        t.add(row, prices, row.gpu_type)
    return t


def by_group(session: Session, column: Any, start: datetime, end: datetime, account: str | None,
             prices: fmt.Prices) -> dict[str, Totals]:
    stmt = (select(column.label("key"), Job.gpu_type, *_sums()).where(*_where(start, end, account))
            .group_by(column, Job.gpu_type))
    out: dict[str, Totals] = {}
    for row in session.exec(stmt).all():  # type: ignore[call-overload]
        out.setdefault(row.key or "(unknown)", Totals()).add(row, prices, row.gpu_type)
    return out


def verdict_counts(session: Session, start: datetime, end: datetime, account: str | None) -> list[dict[str, Any]]:
    wasted = func.coalesce(Job.idle_gpu_hours, 0.0) + func.coalesce(Job.underfilled_gpu_hours, 0.0)
    stmt = (select(Job.verdict, func.count().label("jobs"), func.sum(Job.gpu_hours).label("hours"),
                   func.sum(wasted).label("wasted"), func.count(func.distinct(Job.user)).label("users"))
            .where(*_where(start, end, account)).group_by(Job.verdict))
    rows = []
    for r in session.exec(stmt).all():  # type: ignore[call-overload]
        rows.append({"verdict": r.verdict, "label": LABELS.get(r.verdict, r.verdict) if r.verdict else
                     "No verdict (not assessed)", "jobs": int(r.jobs), "hours": float(r.hours or 0.0),
                     "wasted": float(r.wasted or 0.0), "users": int(r.users)})
    rows.sort(key=lambda r: ORDER.get(r["verdict"], 99))
    return rows


def top_verdict_by(session: Session, column: Any, start: datetime, end: datetime, account: str | None
                   ) -> dict[str, str]:
    """Per user (or account): the verdict that cost it the most GPU-hours (healthy/None excluded)."""
    wasted = func.sum(func.coalesce(Job.idle_gpu_hours, 0.0) + func.coalesce(Job.underfilled_gpu_hours, 0.0))
    stmt = (select(column.label("key"), Job.verdict, wasted.label("w")).where(
        *_where(start, end, account), col(Job.verdict).is_not(None), Job.verdict != "healthy")
        .group_by(column, Job.verdict))
    best: dict[str, tuple[float, str]] = {}
    for r in session.exec(stmt).all():  # type: ignore[call-overload]
        key = r.key or "(unknown)"
        if key not in best or float(r.w or 0) > best[key][0]:
            best[key] = (float(r.w or 0), LABELS.get(r.verdict, r.verdict))
    return {k: v for k, (_, v) in best.items()}


def most_wasteful(session: Session, start: datetime, end: datetime, account: str | None, limit: int = 10
                  ) -> list[Job]:
    wasted = func.coalesce(Job.idle_gpu_hours, 0.0) + func.coalesce(Job.underfilled_gpu_hours, 0.0)
    stmt = (select(Job).where(*_where(start, end, account), col(Job.idle_gpu_hours).is_not(None))
            .order_by(wasted.desc(), col(Job.id)).limit(limit))
    return list(session.exec(stmt).all())


@cache
def advice_texts() -> dict[str, str]:
    """Group-level "what to change" per verdict (``reports/advice.toml``)."""
    with open(f"{templates_dir()}/advice.toml", "rb") as fh:
        data = tomllib.load(fh)
    return {k: " ".join(str(v).split()) for k, v in data.items()}


def things_to_change(verdicts: Sequence[dict[str, Any]], currency_cost: dict[str, str]) -> list[dict[str, Any]]:
    """The three verdicts that wasted the most GPU-hours, each with what the group could change."""
    texts = advice_texts()
    ranked = sorted((v for v in verdicts if v["verdict"] not in (None, "healthy") and v["wasted"] > 0),
                    key=lambda v: v["wasted"], reverse=True)[:3]
    out = []
    for v in ranked:
        jobs = f"{v['jobs']} job{'s' if v['jobs'] != 1 else ''}"
        users = f"{v['users']} user{'s' if v['users'] != 1 else ''}"
        text = texts.get(v["verdict"], "See the job cards for what to try.")
        out.append({"label": v["label"], "text": text, "jobs": jobs, "users": users,
                    "wasted": fmt.hours(v["wasted"]), "cost": currency_cost.get(v["verdict"])})
    return out


def _group_rows(groups: dict[str, Totals], top: dict[str, str], prices: fmt.Prices) -> list[dict[str, Any]]:
    rows = []
    for key, t in sorted(groups.items(), key=lambda kv: (-kv[1].wasted, -kv[1].hours["allocated"], kv[0])):
        rows.append({"label": clean(key, 40), "jobs": t.jobs, "allocated": t.hours["allocated"],
                     "active": t.hours["active"], "underfilled": t.hours["underfilled"], "idle": t.hours["idle"],
                     "unmeasured": t.hours["unmeasured"],
                     "allocated_text": fmt.hours(t.hours["allocated"]),
                     "active_share": fmt.pct(t.measured_share("active")) if t.measured else "n/a",
                     "wasted_text": fmt.hours(t.wasted), "wasted_cost": prices.fmt(t.wasted_cost)
                     if prices.enabled else None, "top_verdict": top.get(key, "\u2013")})
    return rows


@dataclass
class Summary:
    subject: str
    text: str
    chart: bytes | None
    context: dict[str, Any]
    jobs: int

    def html(self, chart_src: str) -> str:
        return render("monthly.html.j2", **self.context, chart_src=chart_src if self.chart else "")


def build_summary(session: Session, config: Any, month: str, account: str | None) -> Summary:
    """Aggregate one month (for ``account``, or the whole site when None) and render the summary."""
    rep = config.reports
    prices = fmt.Prices(rep.price_per_gpu_hour, rep.currency)
    start, end = month_bounds(month)
    prev = previous_month(month)
    pstart, pend = month_bounds(prev)
    now_t = totals(session, start, end, account, prices)
    prev_t = totals(session, pstart, pend, account, prices)
    group_col = Job.user if account is not None else Job.account
    group_name = "user" if account is not None else "account"
    groups = by_group(session, group_col, start, end, account, prices)
    top = top_verdict_by(session, group_col, start, end, account)
    rows = _group_rows(groups, top, prices)
    verdicts = verdict_counts(session, start, end, account)
    # Cost of the waste per verdict: priced per GPU model, in SQL groups.
    vcost: dict[str, str] = {}
    if prices.enabled:
        wasted = func.coalesce(Job.idle_gpu_hours, 0.0) + func.coalesce(Job.underfilled_gpu_hours, 0.0)
        stmt = (select(Job.verdict, Job.gpu_type, func.sum(wasted).label("w")).where(*_where(start, end, account))
                .group_by(Job.verdict, Job.gpu_type))
        acc: dict[str, float | None] = {}
        for r in session.exec(stmt).all():  # type: ignore[call-overload]
            c = prices.cost(float(r.w or 0.0), r.gpu_type)
            acc[r.verdict] = None if c is None or acc.get(r.verdict, 0.0) is None else acc.get(r.verdict, 0.0) + c
        vcost = {k: prices.fmt(v) for k, v in acc.items() if k}
    for v in verdicts:
        v["hours_text"], v["wasted_text"] = fmt.hours(v["hours"]), fmt.hours(v["wasted"])
        v["cost"] = vcost.get(v["verdict"]) if prices.enabled else None
    jobs = []
    for j in most_wasteful(session, start, end, account):
        w = (j.idle_gpu_hours or 0.0) + (j.underfilled_gpu_hours or 0.0)
        label = f"{j.array_job_id}_{j.array_task_id}" if j.array_job_id is not None and j.array_task_id is not None \
            else str(j.job_id)
        jobs.append({"id": label, "name": clean(j.job_name, 28) or "", "user": clean(j.user, 20) or "n/a",
                     "account": clean(j.account, 20) or "n/a", "hours": fmt.hours(j.gpu_hours),
                     "wasted": fmt.hours(w), "wasted_share": fmt.pct(fmt.share(w, j.gpu_hours)),
                     "verdict": clean(j.verdict_title, 40) or "no verdict", "gpus": j.gpu_count})
    scope = f"account {clean(account, 40)}" if account is not None else "all accounts"
    cluster = clean(config.site.cluster, 40)
    title = month_title(month)
    trend = {
        "prev_title": month_title(prev), "has_prev": prev_t.jobs > 0,
        "allocated": fmt.signed_pct_change(now_t.hours["allocated"], prev_t.hours["allocated"]),
        "wasted": fmt.signed_pct_change(now_t.wasted, prev_t.wasted),
        "active_share": fmt.signed_points(now_t.measured_share("active"), prev_t.measured_share("active"))
        if prev_t.measured and now_t.measured else None,
        "prev_allocated": fmt.hours(prev_t.hours["allocated"]), "prev_wasted": fmt.hours(prev_t.wasted),
        "prev_active_share": fmt.pct(prev_t.measured_share("active")) if prev_t.measured else "n/a",
    }

    def part(key: str, label: str, color: str, explain: str) -> dict[str, Any]:
        return {"label": label, "hours": now_t.hours[key], "hours_text": fmt.hours(now_t.hours[key]),
                "share_text": fmt.pct(now_t.share(key)) if now_t.hours["allocated"] else "n/a",
                "cost_text": prices.fmt(now_t.cost[key]) if prices.enabled else None, "color": color,
                "explain": explain}

    parts = [part("active", "SM-active", charts.COLORS["active"], "the GPUs' multiprocessors were working"),
             part("underfilled", "Busy, SMs not active", charts.COLORS["underfilled"],
                  "a kernel ran, but most of the GPU sat idle"),
             part("idle", "Idle", charts.COLORS["idle"], "allocated, no kernel running")]
    if now_t.hours["unmeasured"] > 0:
        parts.append(part("unmeasured", "Not measured", charts.COLORS["unmeasured"],
                          "jobs without activity data (allocation only)"))
    tensor = part("tensor", "Tensor-active", charts.COLORS["tensor"], "tensor cores busy (part of SM-active)")
    changes = things_to_change(verdicts, vcost)
    chart = charts.split_chart(rows, f"Where each {group_name}'s GPU-hours went, {title}")
    sm_share = now_t.measured_share("active")
    headline = (f"In {title}, {scope} ran {now_t.jobs} GPU job{'s' if now_t.jobs != 1 else ''} for "
                f"{fmt.hours(now_t.hours['allocated'])} GPU-hours"
                + (f" ({prices.fmt(now_t.cost['allocated'])})" if prices.enabled else "") + ".")
    if now_t.jobs and now_t.measured:
        headline += (f" The GPUs' multiprocessors were working {fmt.pct(sm_share)} of the measured time; "
                     f"{fmt.hours(now_t.wasted)} GPU-hours"
                     + (f" ({prices.fmt(now_t.wasted_cost)})" if prices.enabled else "")
                     + " went to idle or barely-used GPUs.")
    ctx: dict[str, Any] = {
        "title": f"GPU-hour summary {title}: {scope}", "month_title": title, "scope": scope,
        "cluster": cluster, "headline": headline, "jobs": now_t.jobs, "parts": parts, "tensor": tensor,
        "part_widths": list(zip(fmt.widths([p["hours"] for p in parts]), [p["color"] for p in parts],
                                strict=True)),
        "allocated": fmt.hours(now_t.hours["allocated"]),
        "allocated_cost": prices.fmt(now_t.cost["allocated"]) if prices.enabled else None,
        "trend": trend, "group_name": group_name, "rows": rows, "top_jobs": jobs, "verdicts": verdicts,
        "changes": changes, "prices": prices.enabled, "contact": clean(rep.contact, 200),
        "chart_alt": f"Stacked bars: SM-active, busy but underfilled and idle GPU-hours per {group_name}",
        "site_wide": account is None,
    }
    subject = (f"[{cluster}] GPU-hours {title}, {scope}: {fmt.hours(now_t.hours['allocated'])} GPU-h, "
               f"{fmt.pct(sm_share)} SM-active")
    text = render("monthly.txt.j2", **ctx)
    return Summary(subject=subject, text=text, chart=chart, context=ctx, jobs=now_t.jobs)
