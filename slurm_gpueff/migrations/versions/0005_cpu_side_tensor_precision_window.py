"""The CPU side of a job (allocated CPUs, TotalCPU, MaxRSS), tensor activity by precision, and the window
each GPU's figures cover (its length, the measured part of it, how it was taken).

Every new column is nullable: rows stored before have them NULL (not measured), never 0.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 23:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('alloc_cpus', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('total_cpu_s', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('max_rss_bytes', sa.BigInteger(), nullable=True))
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        for name in ('hmma_active', 'imma_active', 'dfma_active', 'window_s', 'measured_s'):
            batch_op.add_column(sa.Column(name, sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('window', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        for name in ('window', 'measured_s', 'window_s', 'dfma_active', 'imma_active', 'hmma_active'):
            batch_op.drop_column(name)
    with op.batch_alter_table('job', schema=None) as batch_op:
        for name in ('max_rss_bytes', 'total_cpu_s', 'alloc_cpus'):
            batch_op.drop_column(name)
