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
from ..storage import summaries
from ..storage.summaries import PARTS
from . import charts
from .card import clean
from .pages import Page, render, sentence, toml
from .prices import Prices, bar_part, share

ORDER = {**{r.name: n for n, r in enumerate(RULES)}, "": len(RULES)}  # then "" (no problem found), then None
NO_PROBLEM = "No problem found"  # a GPU no verdict concerns, of a job with a verdict on its other GPUs


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


def _totals(rows: Sequence[summaries.Split], prices: Prices) -> Totals:
    return Totals(jobs=sum(r.jobs for r in rows), hours={p: sum((r.hours[p] for r in rows), 0.0) for p in PARTS},
                  cost={p: prices.total((r.hours[p], r.gpu_type) for r in rows) for p in PARTS})


def totals(session: Session, start: datetime, end: datetime, account: str | None, prices: Prices) -> Totals:
    return _totals(summaries.split(session, start, end, account), prices)


def by_group(session: Session, by: str, start: datetime, end: datetime, account: str | None,
             prices: Prices) -> dict[str, Totals]:
    groups: dict[str, list[summaries.Split]] = {}
    for row in summaries.split(session, start, end, account, by=by):
        groups.setdefault(row.key or "(unknown)", []).append(row)
    return {key: _totals(rows, prices) for key, rows in groups.items()}


def by_verdict(parts: Sequence[summaries.VerdictPart], prices: Prices) -> list[dict[str, Any]]:
    """The month's GPUs by their verdict (summaries.verdict_parts), in the rules' order: how many GPUs, of how
    many jobs and users, their GPU-hours and lost hours, and the cost of those priced per GPU model. The
    rows add up to the month's GPUs, GPU-hours and lost hours; a job whose GPUs differ counts in each of
    their rows, so the jobs do not add up."""
    rows: dict[str | None, dict[str, Any]] = {}
    for part in parts:
        row = rows.setdefault(part.verdict, {"verdict": part.verdict, "gpus": 0, "jobs": 0, "hours": 0.0,
                                             "wasted": 0.0, "users": set(), "priced": []})
        row["gpus"] += part.gpus
        row["jobs"] += part.jobs
        row["hours"] += part.hours
        row["wasted"] += part.wasted
        row["priced"].append((part.wasted, part.gpu_type))
        if part.user is not None:
            row["users"].add(part.user)
    return [{**{k: v for k, v in row.items() if k != "priced"}, "users": len(row["users"]),
             "label": None if verdict is None else NO_PROBLEM if verdict == "" else label_of(verdict),
             "hours_text": fmt.gpu_hours(row["hours"]), "wasted_text": fmt.gpu_hours(row["wasted"]),
             "cost": prices.fmt(prices.total(row["priced"])) if prices.enabled and verdict is not None else None}
            for verdict, row in sorted(rows.items(), key=lambda kv: 99 if kv[0] is None else ORDER.get(kv[0], 98))]


def worst_verdicts(parts: Sequence[summaries.VerdictPart]) -> dict[str, str]:
    """Per user (or account, the parts' key): the verdict whose GPUs lost it the most GPU-hours; healthy,
    no problem found and not assessed are no problem to name."""
    lost: dict[str, dict[str, float]] = {}
    for part in parts:
        if part.verdict not in (None, "", "healthy"):
            by = lost.setdefault(part.key or "(unknown)", {})
            by[str(part.verdict)] = by.get(str(part.verdict), 0.0) + part.wasted
    return {key: max(sorted(by), key=lambda v: by[v]) for key, by in lost.items()}


def things_to_change(verdicts: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The three verdicts that lost the most GPU-hours, each with what the group could change."""
    texts = {k: " ".join(str(v).split()) for k, v in toml("advice.toml").items()}
    ranked = sorted((v for v in verdicts if v["verdict"] not in (None, "", "healthy") and v["wasted"] > 0),
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
                       worst_verdicts(summaries.verdict_parts(session, start, end, account, by=group_name)), prices)
    verdicts = by_verdict(summaries.verdict_parts(session, start, end, account), prices)
    top_jobs = [{"id": fmt.job_label(j), "name": clean(j.job_name, 28), "user": clean(j.user, 20) or "n/a",
                 "account": clean(j.account, 20) or "n/a", "hours": fmt.gpu_hours(j.gpu_hours),
                 "wasted": fmt.gpu_hours(wasted), "wasted_share": fmt.pct(share(wasted, j.gpu_hours)),
                 "verdict": clean(j.verdict_title, 40) or "no verdict", "gpus": j.gpu_count}
                for j, wasted in summaries.most_wasteful(session, start, end, account)]
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
        "site_wide": account is None, "simulated": summaries.simulated_jobs(session, start, end, account),
    }
    chart = charts.split_chart(rows, sentence("monthly_chart_title", **ctx))
    return Page("monthly.html.j2", subject=sentence("monthly_subject", **ctx), text=render("monthly.txt.j2", **ctx),
                chart=chart, context=ctx)
