"""A partial index of the job rows whose run is not 0: the few jobs that ran more than once.

Counting a requeued job once (its last run) asked, for every job row of a month, whether a later run
exists; the rollups and monthly summaries now first read this small index into a hash and ask only for
the jobs in it.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27 23:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_rerun', ['cluster', 'job_id'], unique=False,
                              postgresql_where=sa.text('run <> 0'), sqlite_where=sa.text('run <> 0'))


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_rerun')
