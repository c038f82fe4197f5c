"""The job table's indexes on end and analysis times hold finished jobs only (``record_source <> 'live'``):
``ix_job_end_time``, ``ix_job_user_end``, ``ix_job_account_end`` and ``ix_job_analyzed_at`` become partial.

Every live record of a running job moves its row's ``end_time`` (the figures' time) and, with its summary,
its ``analyzed_at``. Neither update can be HOT, so each one added an entry to all four indexes at the newest
end of their key range; vacuum removed the old entries, but the pages they left half empty sit among the
finished jobs' entries, where no new key ever lands. At 25,000 running jobs that was most of the database's
growth. Partial, these indexes take no entry from a live update. The indexes whose keys a live update
keeps (the primary key, job ids, ``ix_job_live``) still take a new entry per update; PostgreSQL removes
those duplicates of one key in place (bottom-up deletion), so they do not grow.

The queries that read these indexes say ``record_source <> 'live'`` as a literal (``models.not_live``); a
table of a user's jobs, running ones included, reads the finished ones here and the running ones through
``ix_job_live`` (``storage.summaries``).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29 21:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

FINISHED = sa.text("record_source <> 'live'")
INDEXES = (("ix_job_end_time", ["end_time"]), ("ix_job_user_end", ["user", "end_time"]),
           ("ix_job_account_end", ["account", "end_time"]), ("ix_job_analyzed_at", ["analyzed_at"]))


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        for name, columns in INDEXES:
            batch_op.drop_index(name)
            batch_op.create_index(name, columns, unique=False, postgresql_where=FINISHED, sqlite_where=FINISHED)


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        for name, columns in INDEXES:
            batch_op.drop_index(name)
            batch_op.create_index(name, columns, unique=False)
