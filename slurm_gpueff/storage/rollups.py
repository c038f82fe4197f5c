"""Per-day and per-month sums of the job summaries, in SQL (docs/DESIGN.md "Data flow", step 7).

``usage_rollup`` rows are keyed (period, period_start, cluster, user, account, verdict); only analysed jobs
with an end time count, on the UTC day they ended. A refresh recomputes whole months (delete, aggregate
the day rows, sum them into the month row), so a recomputed month is exact whatever happened before.

A job whose end time moves to another month is re-analysed, which finds its new month; but no row points
at its *old* month any more, so the writer that moves it calls :func:`note_moved` in the same transaction.
:func:`refresh_month` deletes the month's pending row first, in the transaction that recomputes it: a
crash leaves it pending, and a job moved by a transaction committing meanwhile notes it again (on
PostgreSQL that insert waits for the delete's row lock). Sums follow docs/DESIGN.md "Unknown is never zero".
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from sqlalchemy import Date, String, and_, case, cast, delete, func, insert, literal, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine

from ..models import Job, last_run_count, utcnow

MEASURES = ("gpu_hours", "idle_gpu_hours", "underfilled_gpu_hours", "sm_active_gpu_hours",
            "tensor_active_gpu_hours", "energy_j", "kernel_measured_gpu_hours", "sm_measured_gpu_hours",
            "tensor_measured_gpu_hours")
# The *_measured measures: the GPU-hours of the jobs where the figure named here was measured.
_MEASURED = {"kernel_measured_gpu_hours": "idle_gpu_hours", "sm_measured_gpu_hours": "sm_active_gpu_hours",
             "tensor_measured_gpu_hours": "tensor_active_gpu_hours"}
KEYS = ("cluster", "user", "account", "verdict")
SAFETY_MARGIN = timedelta(hours=1)  # clock skew and commits in flight at the last refresh
_ROLLUP, _JOB, _PENDING = (Job.metadata.tables[t] for t in ("usage_rollup", "job", "rollup_pending"))


@dataclass
class RefreshResult:
    months: list[date]
    rows: int
    seconds: float


def month_start(d: date | datetime) -> date:
    return date(d.year, d.month, 1)


def next_month(d: date) -> date:
    return date(d.year + (d.month == 12), d.month % 12 + 1, 1)


def _day_expr(conn: Connection, col: Any) -> Any:
    """The UTC calendar day of a naive-UTC timestamp column, as a DATE on every backend (on SQLite
    'YYYY-MM-DD', SQLAlchemy's own storage format for Date there)."""
    return func.date(col) if conn.dialect.name == "sqlite" else cast(col, Date)


def _month_expr(conn: Connection, col: Any) -> Any:
    return (func.strftime("%Y-%m-01", col) if conn.dialect.name == "sqlite"
            else cast(func.date_trunc("month", col), Date))


def refresh_month(conn: Connection, month: date, now: datetime) -> int:
    """Recompute one month's day and month rows; returns the number of rows written."""
    m0, m1 = month_start(month), next_month(month_start(month))
    r, j, p = _ROLLUP, _JOB, _PENDING
    # First: a job moved while this transaction reads the jobs notes the month again (module docstring).
    conn.execute(delete(p).where(p.c.month == m0))
    conn.execute(delete(r).where(r.c.period_start >= m0, r.c.period_start < m1))
    day = _day_expr(conn, j.c.end_time)
    jkeys, rkeys = [j.c[k] for k in KEYS], [r.c[k] for k in KEYS]
    cols = ["period", "period_start", *KEYS, "jobs", *MEASURES, "refreshed_at"]
    sums = [func.sum(case((j.c[_MEASURED[m]].is_not(None), j.c.gpu_hours))) if m in _MEASURED
            else func.sum(j.c[m]) for m in MEASURES]
    # A requeued job counts once (its last run), the GPU-hours of every run (docs/DESIGN.md, "Runs").
    sel = (select(literal("day", String), day, *jkeys, func.sum(last_run_count()), *sums,
                  literal(now, r.c.refreshed_at.type))
           .where(j.c.end_time >= datetime(m0.year, m0.month, 1), j.c.end_time < datetime(m1.year, m1.month, 1),
                  j.c.analyzed_at.is_not(None), j.c.record_source != "live")  # running jobs: not yet
           .group_by(day, *jkeys))
    conn.execute(insert(r).from_select(cols, sel))
    msel = (select(literal("month", String), literal(m0, Date), *rkeys,
                   func.sum(r.c.jobs), *[func.sum(r.c[m]) for m in MEASURES], literal(now, r.c.refreshed_at.type))
            .where(r.c.period == "day", r.c.period_start >= m0, r.c.period_start < m1)
            .group_by(*rkeys))
    conn.execute(insert(r).from_select(cols, msel))
    return conn.execute(select(func.count()).select_from(r)  # rowcount of INSERT..SELECT is -1 on psycopg
                        .where(r.c.period_start >= m0, r.c.period_start < m1)).scalar() or 0


def dirty_months(conn: Connection, now: datetime, full: bool = False) -> list[date]:
    """The months a refresh recomputes: the current one, those holding a job analysed since the last refresh,
    and those noted in ``rollup_pending``; with ``full``, every month."""
    r, j = _ROLLUP, _JOB
    last = conn.execute(select(func.max(r.c.refreshed_at))).scalar()
    month = _month_expr(conn, j.c.end_time)
    stmt = select(month).distinct().where(j.c.end_time.is_not(None), j.c.analyzed_at.is_not(None))
    if not full and last is not None:
        stmt = stmt.where(j.c.analyzed_at >= last - SAFETY_MARGIN)
    months = {_as_date(m) for (m,) in conn.execute(stmt)}
    months |= {_as_date(m) for (m,) in conn.execute(select(_PENDING.c.month))}
    months.add(month_start(now))
    if full:  # months that lost all their jobs still hold rows: clear them too
        months |= {_as_date(m) for (m,) in conn.execute(select(r.c.period_start).distinct()
                                                         .where(r.c.period == "month"))}
    return sorted(months)


def note_moved(conn: Connection, old_end_times: Iterable[datetime | None]) -> None:
    """Note the months of these old (naive UTC) end times as pending, in the transaction that moves the
    jobs: the next refresh recomputes them. None is ignored; noting a month twice is harmless."""
    months = sorted({month_start(t) for t in old_end_times if t is not None})
    if not months:
        return
    ins = sqlite.insert(_PENDING) if conn.dialect.name == "sqlite" else postgresql.insert(_PENDING)
    conn.execute(ins.values([{"month": m, "noted_at": utcnow()} for m in months]).on_conflict_do_nothing())


def moved_month(old: datetime | None, new: datetime | None) -> bool:
    """Whether an end time going from ``old`` to ``new`` leaves ``old``'s month (see :func:`note_moved`)."""
    return old is not None and (new is None or month_start(old) != month_start(new))


def _as_date(v: date | str) -> date:
    """A month or day from the database: a DATE column, or the text of SQLite's strftime."""
    return v if isinstance(v, date) else date.fromisoformat(v)


def refresh(engine: Engine, *, full: bool = False, months: Iterable[date] | None = None,
            now: datetime | None = None) -> RefreshResult:
    """Refresh the rollups; each month in its own transaction (readers see a month whole or not yet)."""
    t0 = time.perf_counter()
    now = now or utcnow()
    with engine.connect() as conn:
        todo = sorted({month_start(m) for m in months}) if months is not None else dirty_months(conn, now, full)
    rows = 0
    for m in todo:
        with engine.begin() as conn:
            rows += refresh_month(conn, m, now)
    return RefreshResult(months=todo, rows=rows, seconds=time.perf_counter() - t0)


# ---------------------------------------------------------------------------------------------- queries
BY = {"user": ("user",), "account": ("account",), "site": (), "account_verdict": ("account", "verdict")}


def usage(conn: Connection, *, period: str = "month", by: str = "user", start: date | None = None,
          end: date | None = None) -> list[dict[str, Any]]:
    """Summed rollup rows grouped by period and ``by`` (a key of :data:`BY`), ``period_start`` in [start, end):
    dicts of ``period_start``, ``cluster``, the group keys, ``jobs`` and every measure (None: not measured)."""
    if period not in ("day", "month"):
        raise ValueError(f"period must be day or month, not {period!r}")
    r = _ROLLUP
    keys = [r.c.period_start, r.c.cluster, *[r.c[k] for k in BY[by]]]
    conds = [r.c.period == period]
    if start is not None:
        conds.append(r.c.period_start >= start)
    if end is not None:
        conds.append(r.c.period_start < end)
    stmt = (select(*keys, func.sum(r.c.jobs).label("jobs"), *[func.sum(r.c[m]).label(m) for m in MEASURES])
            .where(and_(*conds)).group_by(*keys).order_by(*keys))
    return [{**row, "period_start": _as_date(row["period_start"]), "jobs": int(row["jobs"] or 0)}
            for row in conn.execute(stmt).mappings()]
