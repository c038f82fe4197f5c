"""PostgreSQL: autovacuum the tables that running jobs rewrite once 1 % of their rows are dead, not 20 %.

Every live record rewrites its job's row, its GPU rows and its timelines, and replaces its live samples.
At PostgreSQL's default scale factor (20 %) a year's ten million job rows let about two million dead row
versions pile up before autovacuum makes their space reusable: the database then grows far faster at a
steady load than the rows it adds. At 1 % (and the planner's statistics refreshed
at 2 %) the dead versions of a few minutes' live records are reused instead. SQLite has no autovacuum of
this kind; nothing to do there.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28 15:00:00
"""

from __future__ import annotations

from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

TABLES = ("job", "job_gpu", "job_gpu_timeline", "live_sample", "rollup_pending")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f'ALTER TABLE "{table}" SET (autovacuum_vacuum_scale_factor = 0.01, '
                   'autovacuum_analyze_scale_factor = 0.02)')


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in TABLES:
        op.execute(f'ALTER TABLE "{table}" RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor)')
