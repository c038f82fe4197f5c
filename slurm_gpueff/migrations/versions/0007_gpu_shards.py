"""The shards of a shared GPU a job held (Slurm gres/shard), and how many the GPU has: the job's share of it.

Both nullable: a GPU held whole (every row stored before) has them NULL.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-27 15:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.add_column(sa.Column('shards', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('shard_count', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.drop_column('shard_count')
        batch_op.drop_column('shards')
