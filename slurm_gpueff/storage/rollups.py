"""Per-day and per-month sums of the job summaries, in SQL (docs/DESIGN.md "Data flow", step 7).

``usage_rollup``'s month rows are keyed (month, cluster, user, account, primary verdict), its day rows (day,
cluster, user, account) with the verdict NULL; only analysed jobs with an end time count, on the UTC day
they ended. A refresh recomputes whole months (delete, then the day rows and the month rows each straight
from the month's jobs), so a recomputed month is exact whatever happened before.

Why the day rows leave the verdict out: at a large site nearly every job is alone in its day x user x account
x verdict, so such day rows were about as many as the jobs, and writing them was most of a refresh. By day
and user they are a rollup again (tens of jobs a row), and the verdicts are summed per month, which is what
/metrics and the monthly summaries read.

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

from ..models import Job, last_run_count, not_live, utcnow

MEASURES = ("gpu_hours", "idle_gpu_hours", "underfilled_gpu_hours", "sm_active_gpu_hours",
            "tensor_active_gpu_hours", "energy_j", "kernel_measured_gpu_hours", "sm_measured_gpu_hours",
            "tensor_measured_gpu_hours")
# The *_measured measures: the GPU-hours of the jobs where the figure named here was measured.
_MEASURED = {"kernel_measured_gpu_hours": "idle_gpu_hours", "sm_measured_gpu_hours": "sm_active_gpu_hours",
             "tensor_measured_gpu_hours": "tensor_active_gpu_hours"}
KEYS = ("cluster", "user", "account", "verdict")  # a month row's
DAY_KEYS = ("cluster", "user", "account")  # a day row's: its verdict is NULL
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
    if conn.dialect.name == "postgresql":
        # Two settings for this transaction only. JIT compiled these aggregates anew on every refresh, which
        # took longer than the query runs without it. And psycopg prepares a statement run five times (the
        # service refreshes all day): PostgreSQL's generic plan for it cannot see the month's bounds and
        # read the whole job table instead of the month's range of its end-time index.
        conn.exec_driver_sql("SET LOCAL jit = off")
        conn.exec_driver_sql("SET LOCAL plan_cache_mode = force_custom_plan")
    # First: a job moved while this transaction reads the jobs notes the month again (module docstring).
    conn.execute(delete(p).where(p.c.month == m0))
    conn.execute(delete(r).where(r.c.period_start >= m0, r.c.period_start < m1))
    cols = ["period", "period_start", *KEYS, "jobs", *MEASURES, "refreshed_at"]
    sums = [func.sum(case((j.c[_MEASURED[m]].is_not(None), j.c.gpu_hours))) if m in _MEASURED
            else func.sum(j.c[m]) for m in MEASURES]
    ended = (j.c.end_time >= datetime(m0.year, m0.month, 1), j.c.end_time < datetime(m1.year, m1.month, 1),
             j.c.analyzed_at.is_not(None), not_live(j))  # running jobs: not yet
    # A requeued job counts once (its last run), the GPU-hours of every run (docs/DESIGN.md, "Runs").
    # Day rows without the verdict, month rows with it, each straight from the jobs (module docstring).
    day = _day_expr(conn, j.c.end_time)
    dkeys, mkeys = [j.c[k] for k in DAY_KEYS], [j.c[k] for k in KEYS]
    for period, start, keys, group in (("day", day, [*dkeys, literal(None, String)], [day, *dkeys]),
                                       ("month", literal(m0, Date), mkeys, mkeys)):
        sel = (select(literal(period, String), start, *keys, func.sum(last_run_count()), *sums,
                      literal(now, r.c.refreshed_at.type)).where(*ended).group_by(*group))
        conn.execute(insert(r).from_select(cols, sel))
    return conn.execute(select(func.count()).select_from(r)  # rowcount of INSERT..SELECT is -1 on psycopg
                        .where(r.c.period_start >= m0, r.c.period_start < m1)).scalar() or 0


def dirty_months(conn: Connection, now: datetime, full: bool = False) -> list[date]:
    """The months a refresh recomputes: the current one, those holding a job analysed since the last refresh,
    and those noted in ``rollup_pending``; with ``full``, every month."""
    r, j = _ROLLUP, _JOB
    last = conn.execute(select(func.max(r.c.refreshed_at))).scalar()
    month = _month_expr(conn, j.c.end_time)
    stmt = select(month).distinct().where(j.c.end_time.is_not(None), j.c.analyzed_at.is_not(None),
                                          not_live(j))  # running jobs are not in the rollups yet
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
    if period == "day" and "verdict" in BY[by]:
        raise ValueError("day rows are not kept by verdict: only month rows are")
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
