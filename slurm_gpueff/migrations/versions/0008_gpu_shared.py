"""A GPU shared with other jobs during the job: with whom, how its part was measured, its share.

Nullable JSON: a GPU held alone (every row stored before) has it NULL, and its figures are the device's.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27 18:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.add_column(sa.Column('shared', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.drop_column('shared')
