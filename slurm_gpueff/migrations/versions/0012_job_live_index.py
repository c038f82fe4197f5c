"""A partial index of the running jobs' rows (``record_source = 'live'``): ``ix_job_live``.

The idle-GPU policy pass reads every running job's row each time it runs; without an index that was a
scan of the whole job table, a year of finished jobs read to find the few thousand that still run, so the
pass grew with the site's history rather than with what runs now. Rows leave the index when the job's
final record replaces its live one.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-28 18:15:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_live', ['id'], unique=False,
                              postgresql_where=sa.text("record_source = 'live'"),
                              sqlite_where=sa.text("record_source = 'live'"))


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index('ix_job_live')
