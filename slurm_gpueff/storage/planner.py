"""What PostgreSQL's planner is told about the tables where its own sampling falls short, measured from the
site's own rows.

``job_gpu.job_pk``: PostgreSQL estimates a column's distinct values from a sample of rows, and for this key
(each job's few GPU rows side by side) the estimate falls short by a factor of tens; the idle-GPU pass then
read the whole job_gpu table instead of each running job's rows by the index. Migration 0013 states the
figure as a fraction of the rows, ``n_distinct = -0.25`` (a job has four GPU rows); :func:`job_gpu_distinct`
replaces it with the site's own: -(job rows / job_gpu rows), GPU rows a job as this site runs them, whatever
its mix of jobs of 1 to 16 GPUs or more. No-op on SQLite, whose planner has no such setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import ProgrammingError

# -1: one GPU row a job, every value distinct, the most there can be (jobs with no GPU row, which the job
# count includes, do not make more). -1/64: 64 GPU rows a job on average, as if every job ran on 8 nodes of 8
# GPUs; a site's mean lies well within, and a figure past it comes from counts out of step with each other
# (one table's statistics much older than the other's), not from the jobs.
MOST_DISTINCT = -1.0
LEAST_DISTINCT = -1 / 64
# A setting within this fraction of the measured one is left as it is: the plan turns on the figure's order
# of magnitude, not on its last digits, and each change costs an ANALYZE of the table.
TOLERANCE = 0.10
NOT_OWNER = "42501"  # SQLSTATE insufficient_privilege: ALTER TABLE by a role that does not own the table


@dataclass(frozen=True)
class Distinct:
    """What :func:`job_gpu_distinct` found and did; ``line`` says it for the log."""

    jobs: float  # job rows, as PostgreSQL's statistics have them (counted when they have none)
    gpu_rows: float  # job_gpu rows, the same way
    was: float | None  # the setting found; None: none (PostgreSQL's sampled estimate)
    now: float | None  # the setting after this run
    why_not: str = ""  # why it was not set, where the measured figure differed

    @property
    def changed(self) -> bool:
        return self.now != self.was

    def line(self) -> str:
        rows = f"{self.jobs:,.0f} jobs, {self.gpu_rows:,.0f} GPU rows"
        was = "none" if self.was is None else f"{self.was:g}"
        if self.changed:
            return f"job_gpu.job_pk n_distinct set to {self.now:g} (was {was}; {rows})"
        if self.why_not:
            return f"job_gpu.job_pk n_distinct left at {was}: {self.why_not} ({rows})"
        return f"job_gpu.job_pk n_distinct kept at {was} ({rows})"


def job_gpu_distinct(engine: Engine) -> Distinct | None:
    """On PostgreSQL, set ``job_gpu.job_pk``'s ``n_distinct`` to -(job rows / job_gpu rows), within
    [MOST_DISTINCT, LEAST_DISTINCT], then ANALYZE job_gpu so that the planner has it, where it differs from the
    current setting by more than TOLERANCE; None on SQLite. The row counts are the tables' ``reltuples``,
    which every ANALYZE (autovacuum's: at 2 % of the rows changed, migration 0010) keeps, or a count where the
    table has none yet (never analysed). The ALTER takes a SHARE UPDATE EXCLUSIVE lock: reads and writes go
    on; only a concurrent VACUUM or ANALYZE of the table waits, or waits for it."""
    if engine.dialect.name != "postgresql":
        return None
    with engine.begin() as conn:
        jobs, gpu_rows = _rows(conn, "job"), _rows(conn, "job_gpu")
        was = _setting(conn)
        if not gpu_rows:
            return Distinct(jobs, gpu_rows, was, was, "no GPU rows yet")
        # rounded for a setting that reads well; both bounds have fewer digits, so it stays within them
        want = float(f"{max(MOST_DISTINCT, min(LEAST_DISTINCT, -jobs / gpu_rows)):.6g}")
        if was is not None and abs(want - was) <= TOLERANCE * abs(was):
            return Distinct(jobs, gpu_rows, was, was)
    try:
        with engine.begin() as conn:
            conn.execute(text(f"ALTER TABLE job_gpu ALTER COLUMN job_pk SET (n_distinct = {want:g})"))
            conn.execute(text("ANALYZE job_gpu"))
    except ProgrammingError as exc:
        if getattr(exc.orig, "sqlstate", None) != NOT_OWNER:
            raise
        return Distinct(jobs, gpu_rows, was, was, f"{want:g} measured, but the service's database role does "
                                                  "not own job_gpu, and only its owner may set it")
    return Distinct(jobs, gpu_rows, was, want)


def _rows(conn: Connection, table: str) -> float:
    """The table's rows as its statistics have them, or counted where they have none (-1: never analysed or
    vacuumed; 0: empty when last analysed, perhaps not now)."""
    estimate = conn.execute(text("SELECT reltuples FROM pg_class WHERE oid = CAST(:t AS regclass)"),
                            {"t": table}).scalar()
    if estimate is not None and estimate > 0:
        return float(estimate)
    return float(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() or 0)


def _setting(conn: Connection) -> float | None:
    """job_gpu.job_pk's n_distinct as set (ALTER TABLE ... SET), or None where it is not set."""
    options = conn.execute(text("SELECT attoptions FROM pg_attribute WHERE attrelid = CAST('job_gpu' AS regclass) "
                                "AND attname = 'job_pk'")).scalar()
    for option in options or []:
        name, _, value = str(option).partition("=")
        if name == "n_distinct":
            return float(value)
    return None
