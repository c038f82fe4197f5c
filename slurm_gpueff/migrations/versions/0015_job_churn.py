"""Fewer index entries for every running job's update, and room for the GPU rows' updates in their pages.

Every live record of a running job (one every ``[agent] live_interval_s``, 25,000 jobs at a large site)
updates its ``job`` row twice (ingest, then its summary) and each of its ``job_gpu`` rows once. PostgreSQL
writes a new row version for each update and, unless the update is HOT (no indexed column changed and room
on the same page), a new entry in every one of the table's indexes, changed or not; those entries are what
grows the database between two passes of autovacuum.

* ``job``: its live updates change ``end_time`` (the figures' time) and ``analyzed_at`` (indexed), so they
  cannot be HOT; what can shrink is the number of indexes each update writes into. ``ix_job_verdict`` and
  ``ix_job_start_time`` serve no query (verdicts are filtered by inequality beside a time range, which the
  time indexes serve; no query selects by start time): dropped.
* ``job_gpu``: its live updates change no indexed column (the unique ``(job_pk, node, gpu_index)`` and the
  primary key stay), so they are HOT where the page has room: ``fillfactor = 80`` leaves a fifth of each new
  page for them. Pages written before keep their fill until rewritten (VACUUM FULL, or ``gpueff db copy``).

* ``usage_rollup``: the rollups task rewrites the current month's rows (every user's days and verdicts)
  every ``[service] rollup_interval_s``; autovacuumed once 1 % of its rows are dead, as the tables running
  jobs rewrite are (migration 0010), so the space of one rewrite is reused by the next.

PostgreSQL only for the fillfactor and autovacuum (SQLite has no such settings); the indexes go on both.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-29 09:00:00
"""

from __future__ import annotations

from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_verdict'))
        batch_op.drop_index(batch_op.f('ix_job_start_time'))
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job_gpu SET (fillfactor = 80)")
        op.execute("ALTER TABLE usage_rollup SET (autovacuum_vacuum_scale_factor = 0.01, "
                   "autovacuum_analyze_scale_factor = 0.02)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE job_gpu RESET (fillfactor)")
        op.execute("ALTER TABLE usage_rollup RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor)")
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_start_time'), ['start_time'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_verdict'), ['verdict'], unique=False)
