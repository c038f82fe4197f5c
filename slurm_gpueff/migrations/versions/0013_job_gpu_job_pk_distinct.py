"""PostgreSQL: tell the planner that ``job_gpu.job_pk`` has about one value per four rows (a job's GPUs).

PostgreSQL estimates a column's number of distinct values from a sample of rows, and for a key of this kind
(a year of jobs, each with its few GPU rows side by side) the estimate falls short by a factor of tens: it
then expects a hundred GPU rows a job, and for the GPU rows of a few thousand jobs (every running job, in
the idle-GPU pass) it reads the whole table instead of looking each job up in its index. Stated as a
fraction of the rows (``n_distinct = -0.25``), the figure stays right as the table grows; within a factor of
four for jobs of 1 to 16 GPUs, which is all the plan needs. Takes effect at the next ANALYZE, run here.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28 19:00:00
"""

from __future__ import annotations

from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute('ALTER TABLE job_gpu ALTER COLUMN job_pk SET (n_distinct = -0.25)')
    op.execute('ANALYZE job_gpu')


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute('ALTER TABLE job_gpu ALTER COLUMN job_pk RESET (n_distinct)')
    op.execute('ANALYZE job_gpu')
