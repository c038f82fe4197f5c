"""The monthly GPU-hour summary for a research lead (one account) or the site (all accounts).

The presenter: the plain data of :mod:`.queries`, priced per GPU model and formatted, into the context of
``monthly.html.j2`` and ``monthly.txt.j2``; the words are in the templates and ``advice.toml``.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from sqlmodel import Session

from .. import fmt
from ..analysis.verdicts import RULES, label_of
from ..config import Config
from . import charts, queries
from .card import clean
from .prices import Prices, bar_part, share
from .queries import PARTS
from .templates import Page, render, sentence, toml

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
    return (month_bounds(month)[0] - timedelta(days=1)).strftime("%Y-%m")


def month_title(month: str) -> str:
    return month_bounds(month)[0].strftime("%B %Y")


class Totals(NamedTuple):
    """GPU-hours of one group (the month, a user, an account) and their cost per part."""

    jobs: int
    hours: dict[str, float]
    cost: dict[str, float | None]

    @property
    def wasted(self) -> float:
        return self.hours["idle"] + self.hours["underfilled"]

    @property
    def wasted_cost(self) -> float | None:
        a, b = self.cost["idle"], self.cost["underfilled"]
        return None if a is None or b is None else a + b

    @property
    def measured(self) -> float:
        return self.hours["allocated"] - self.hours["unmeasured"]

    def measured_share(self, part: str) -> float | None:
        """Share of the *measured* GPU-hours (the unmeasured ones have no split)."""
        return share(self.hours[part], self.measured)


def _totals(rows: Sequence[queries.Split], prices: Prices) -> Totals:
    return Totals(jobs=sum(r.jobs for r in rows), hours={p: sum((r.hours[p] for r in rows), 0.0) for p in PARTS},
                  cost={p: prices.total((r.hours[p], r.gpu_type) for r in rows) for p in PARTS})


def totals(session: Session, start: datetime, end: datetime, account: str | None, prices: Prices) -> Totals:
    return _totals(queries.split(session, start, end, account), prices)


def by_group(session: Session, by: str, start: datetime, end: datetime, account: str | None,
             prices: Prices) -> dict[str, Totals]:
    groups: dict[str, list[queries.Split]] = {}
    for row in queries.split(session, start, end, account, by=by):
        groups.setdefault(row.key or "(unknown)", []).append(row)
    return {key: _totals(rows, prices) for key, rows in groups.items()}


def verdict_costs(session: Session, start: datetime, end: datetime, account: str | None,
                  prices: Prices) -> dict[str, str | None]:
    """Cost of the GPU-hours lost per verdict, priced per GPU model; empty when prices are off."""
    if not prices.enabled:
        return {}
    wasted: dict[str, list[tuple[float, str | None]]] = {}
    for verdict, model, hours in queries.wasted_by_verdict_and_model(session, start, end, account):
        if verdict:
            wasted.setdefault(verdict, []).append((hours, model))
    return {verdict: prices.fmt(prices.total(pairs)) for verdict, pairs in wasted.items()}


def things_to_change(verdicts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The three verdicts that lost the most GPU-hours, each with what the group could change."""
    texts = {k: " ".join(str(v).split()) for k, v in toml("advice.toml").items()}
    ranked = sorted((v for v in verdicts if v["verdict"] not in (None, "healthy") and v["wasted"] > 0),
                    key=lambda v: v["wasted"], reverse=True)[:3]
    return [{**v, "text": texts.get(v["verdict"], "See the job cards for what to try.")} for v in ranked]


def _group_rows(groups: dict[str, Totals], top: dict[str, str], prices: Prices) -> list[dict[str, Any]]:
    return [{"label": clean(key, 40), "jobs": t.jobs, **{p: t.hours[p] for p in PARTS},
             "allocated_text": fmt.gpu_hours(t.hours["allocated"]), "active_share": fmt.pct(t.measured_share("active")),
             "wasted_text": fmt.gpu_hours(t.wasted), "wasted_cost": prices.fmt(t.wasted_cost),
             "top_verdict": label_of(top[key]) if key in top else "\u2013"}
            for key, t in sorted(groups.items(), key=lambda kv: (-kv[1].wasted, -kv[1].hours["allocated"], kv[0]))]


def build_summary(session: Session, config: Config, month: str, account: str | None) -> Page:
    """Aggregate one month (for ``account``, or the whole site when None) and render the summary."""
    rep = config.reports
    prices = Prices(rep.price_per_gpu_hour, rep.currency)
    start, end = month_bounds(month)
    prev = previous_month(month)
    now_t = totals(session, start, end, account, prices)
    prev_t = totals(session, *month_bounds(prev), account, prices)
    group_name = "user" if account is not None else "account"
    rows = _group_rows(by_group(session, group_name, start, end, account, prices),
                       queries.worst_verdict_by(session, group_name, start, end, account), prices)
    vcost = verdict_costs(session, start, end, account, prices)
    verdicts = [{"verdict": v.verdict, "label": label_of(v.verdict) if v.verdict else None,
                 "jobs": v.jobs, "users": v.users, "hours": v.hours, "wasted": v.wasted,
                 "hours_text": fmt.gpu_hours(v.hours), "wasted_text": fmt.gpu_hours(v.wasted),
                 "cost": vcost.get(v.verdict) if v.verdict else None}
                for v in sorted(queries.verdict_counts(session, start, end, account),
                                key=lambda v: ORDER.get(v.verdict or "", 99))]
    top_jobs = [{"id": fmt.job_label(j), "name": clean(j.job_name, 28), "user": clean(j.user, 20) or "n/a",
                 "account": clean(j.account, 20) or "n/a", "hours": fmt.gpu_hours(j.gpu_hours),
                 "wasted": fmt.gpu_hours(wasted), "wasted_share": fmt.pct(share(wasted, j.gpu_hours)),
                 "verdict": clean(j.verdict_title, 40) or "no verdict", "gpus": j.gpu_count}
                for j, wasted in queries.most_wasteful(session, start, end, account)]
    title = month_title(month)
    trend = {
        "prev_title": month_title(prev), "has_prev": prev_t.jobs > 0,
        "allocated": fmt.change(now_t.hours["allocated"], prev_t.hours["allocated"]),
        "wasted": fmt.change(now_t.wasted, prev_t.wasted),
        "active_share": fmt.points(now_t.measured_share("active"), prev_t.measured_share("active")),
        "prev_allocated": fmt.gpu_hours(prev_t.hours["allocated"]), "prev_wasted": fmt.gpu_hours(prev_t.wasted),
        "prev_active_share": fmt.pct(prev_t.measured_share("active")),
    }
    parts = [bar_part(key, now_t.hours[key], now_t.hours["allocated"], prices.fmt(now_t.cost[key]), charts.COLORS[key])
             for key in ("active", "underfilled", "idle", "unmeasured", "tensor")
             if key != "unmeasured" or now_t.hours["unmeasured"] > 0]
    ctx: dict[str, Any] = {
        "month_title": title, "scope": f"account {clean(account, 40)}" if account is not None else "all accounts",
        "cluster": clean(config.site.cluster, 40), "jobs": now_t.jobs, "measured": now_t.measured > 0,
        "parts": parts[:-1], "tensor": parts[-1],
        "allocated": fmt.gpu_hours(now_t.hours["allocated"]), "allocated_cost": prices.fmt(now_t.cost["allocated"]),
        "sm_share": fmt.pct(now_t.measured_share("active")), "wasted": fmt.gpu_hours(now_t.wasted),
        "wasted_cost": prices.fmt(now_t.wasted_cost),
        "trend": trend, "group_name": group_name, "rows": rows, "top_jobs": top_jobs, "verdicts": verdicts,
        "changes": things_to_change(verdicts), "prices": prices.enabled, "contact": clean(rep.contact, 200),
        "site_wide": account is None, "simulated": queries.simulated_jobs(session, start, end, account),
    }
    chart = charts.split_chart(rows, sentence("monthly_chart_title", **ctx))
    return Page("monthly.html.j2", subject=sentence("monthly_subject", **ctx), text=render("monthly.txt.j2", **ctx),
                chart=chart, context=ctx)
