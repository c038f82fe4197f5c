"""live_sample and alert_log: the idle-GPU policy's sliding windows over running jobs, and its audit.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 02:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('live_sample',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_pk', sa.Integer(), nullable=False),
    sa.Column('node', sa.String(length=128), nullable=False),
    sa.Column('gpu_index', sa.Integer(), nullable=False),
    sa.Column('as_of', sa.DateTime(), nullable=False),
    sa.Column('covered_s', sa.Float(), nullable=False),
    sa.Column('kernel_s', sa.Float(), nullable=True),
    sa.Column('sm_s', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['job_pk'], ['job.id'], name=op.f('fk_live_sample_job_pk_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_live_sample')),
    sa.UniqueConstraint('job_pk', 'node', 'gpu_index', 'as_of', name='uq_live_sample_job_gpu_as_of')
    )
    op.create_table('alert_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(), nullable=False),
    sa.Column('cluster', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=False),
    sa.Column('run', sa.Integer(), nullable=False),
    sa.Column('user', sa.String(length=128), nullable=True),
    sa.Column('account', sa.String(length=128), nullable=True),
    sa.Column('action', sa.String(length=32), nullable=False),
    sa.Column('dry_run', sa.Boolean(), nullable=False),
    sa.Column('detail', sa.String(length=2048), nullable=False),
    sa.Column('outcome', sa.String(length=512), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_log'))
    )
    op.create_index(op.f('ix_alert_log_at'), 'alert_log', ['at'], unique=False)
    op.create_index(op.f('ix_alert_log_job_id'), 'alert_log', ['job_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_alert_log_job_id'), table_name='alert_log')
    op.drop_index(op.f('ix_alert_log_at'), table_name='alert_log')
    op.drop_table('alert_log')
    op.drop_table('live_sample')
