"""The job table's user and account indexes also ordered by end time: ``ix_job_user_end`` and
``ix_job_account_end`` replace ``ix_job_user`` and ``ix_job_account``.

A month of one account (a monthly summary's every query) or a year of one user (``seff-gpu -u``) was found
by intersecting the account's jobs of every month with every account's jobs of the month: at a site's
size, the end-time half of that read the whole site's month of index entries for a query that keeps one
account's. With the end time second, the index holds exactly the rows asked for, and still serves
every look-up by user or account alone. On PostgreSQL the upgrade builds two indexes over the job table
while it holds the table's write lock: run it with the service stopped.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28 15:20:00
"""

from __future__ import annotations

from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_user_end', ['user', 'end_time'], unique=False)
        batch_op.create_index('ix_job_account_end', ['account', 'end_time'], unique=False)
        batch_op.drop_index('ix_job_user')
        batch_op.drop_index('ix_job_account')


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index('ix_job_account', ['account'], unique=False)
        batch_op.create_index('ix_job_user', ['user'], unique=False)
        batch_op.drop_index('ix_job_account_end')
        batch_op.drop_index('ix_job_user_end')
