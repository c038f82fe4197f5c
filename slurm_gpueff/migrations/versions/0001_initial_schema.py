"""Initial schema: job, job_gpu (with DCGM/MIG columns), job_gpu_timeline, report_log, report_optout,
usage_rollup.

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-22 14:19:56.596817
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel.sql.sqltypes
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('job',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('cluster', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('job_id', sa.BigInteger(), nullable=False),
    sa.Column('array_job_id', sa.BigInteger(), nullable=True),
    sa.Column('array_task_id', sa.BigInteger(), nullable=True),
    sa.Column('het_job_id', sa.BigInteger(), nullable=True),
    sa.Column('het_job_offset', sa.Integer(), nullable=True),
    sa.Column('job_name', sqlmodel.sql.sqltypes.AutoString(length=512), nullable=True),
    sa.Column('user', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('uid', sa.BigInteger(), nullable=True),
    sa.Column('account', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('partition', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('qos', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('nodelist', sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True),
    sa.Column('gpu_count', sa.Integer(), nullable=False),
    sa.Column('gpu_type', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('submit_time', sa.DateTime(), nullable=True),
    sa.Column('start_time', sa.DateTime(), nullable=True),
    sa.Column('end_time', sa.DateTime(), nullable=True),
    sa.Column('elapsed_s', sa.Float(), nullable=True),
    sa.Column('state', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
    sa.Column('exit_code', sa.Integer(), nullable=True),
    sa.Column('signal', sa.Integer(), nullable=True),
    sa.Column('backend', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('reason', sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True),
    sa.Column('record_source', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('enriched', sa.Boolean(), nullable=False),
    sa.Column('ingested_at', sa.DateTime(), nullable=True),
    sa.Column('gpu_hours', sa.Float(), nullable=True),
    sa.Column('idle_gpu_hours', sa.Float(), nullable=True),
    sa.Column('underfilled_gpu_hours', sa.Float(), nullable=True),
    sa.Column('sm_active_gpu_hours', sa.Float(), nullable=True),
    sa.Column('tensor_active_gpu_hours', sa.Float(), nullable=True),
    sa.Column('kernel_active', sa.Float(), nullable=True),
    sa.Column('sm_active', sa.Float(), nullable=True),
    sa.Column('tensor_active', sa.Float(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.Column('verdict', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
    sa.Column('verdict_title', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('analyzed_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job')),
    sa.UniqueConstraint('cluster', 'job_id', name='uq_job_cluster_job_id')
    )
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_account'), ['account'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_analyzed_at'), ['analyzed_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_array_job_id'), ['array_job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_end_time'), ['end_time'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_het_job_id'), ['het_job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_job_id'), ['job_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_start_time'), ['start_time'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_user'), ['user'], unique=False)
        batch_op.create_index(batch_op.f('ix_job_verdict'), ['verdict'], unique=False)

    op.create_table('report_log',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('subject', sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
    sa.Column('dry_run', sa.Boolean(), nullable=False),
    sa.Column('job_pk', sa.Integer(), nullable=True),
    sa.Column('user', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('recipients', sqlmodel.sql.sqltypes.AutoString(length=2048), nullable=False),
    sa.Column('status', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('reason', sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('sent_at', sa.DateTime(), nullable=True),
    sa.Column('next_try_at', sa.DateTime(), nullable=True),
    sa.Column('archive', sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_report_log')),
    sa.UniqueConstraint('kind', 'subject', 'dry_run', name='uq_report_log_kind_subject_dry_run')
    )
    with op.batch_alter_table('report_log', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_report_log_created_at'), ['created_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_report_log_job_pk'), ['job_pk'], unique=False)
        batch_op.create_index(batch_op.f('ix_report_log_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_report_log_user'), ['user'], unique=False)

    op.create_table('report_optout',
    sa.Column('user', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('note', sqlmodel.sql.sqltypes.AutoString(length=512), nullable=True),
    sa.PrimaryKeyConstraint('user', name=op.f('pk_report_optout'))
    )
    op.create_table('usage_rollup',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('period', sqlmodel.sql.sqltypes.AutoString(length=8), nullable=False),
    sa.Column('period_start', sa.Date(), nullable=False),
    sa.Column('cluster', sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
    sa.Column('user', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('account', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('verdict', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
    sa.Column('jobs', sa.Integer(), nullable=False),
    sa.Column('gpu_hours', sa.Float(), nullable=True),
    sa.Column('idle_gpu_hours', sa.Float(), nullable=True),
    sa.Column('underfilled_gpu_hours', sa.Float(), nullable=True),
    sa.Column('sm_active_gpu_hours', sa.Float(), nullable=True),
    sa.Column('tensor_active_gpu_hours', sa.Float(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.Column('kernel_measured_gpu_hours', sa.Float(), nullable=True),
    sa.Column('sm_measured_gpu_hours', sa.Float(), nullable=True),
    sa.Column('tensor_measured_gpu_hours', sa.Float(), nullable=True),
    sa.Column('refreshed_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_usage_rollup'))
    )
    with op.batch_alter_table('usage_rollup', schema=None) as batch_op:
        batch_op.create_index('ix_usage_rollup_period_start', ['period', 'period_start'], unique=False)

    op.create_table('job_gpu',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_pk', sa.Integer(), nullable=False),
    sa.Column('node', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
    sa.Column('gpu_index', sa.Integer(), nullable=False),
    sa.Column('minor', sa.Integer(), nullable=True),
    sa.Column('uuid', sqlmodel.sql.sqltypes.AutoString(length=96), nullable=True),
    sa.Column('pci_bus_id', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
    sa.Column('model', sqlmodel.sql.sqltypes.AutoString(length=128), nullable=True),
    sa.Column('memory_total_bytes', sa.BigInteger(), nullable=True),
    sa.Column('start_time', sa.DateTime(), nullable=True),
    sa.Column('end_time', sa.DateTime(), nullable=True),
    sa.Column('kernel_active', sa.Float(), nullable=True),
    sa.Column('sm_active', sa.Float(), nullable=True),
    sa.Column('sm_occupancy', sa.Float(), nullable=True),
    sa.Column('tensor_active', sa.Float(), nullable=True),
    sa.Column('dram_active', sa.Float(), nullable=True),
    sa.Column('fp64_active', sa.Float(), nullable=True),
    sa.Column('fp32_active', sa.Float(), nullable=True),
    sa.Column('fp16_active', sa.Float(), nullable=True),
    sa.Column('memory_used_peak_bytes', sa.BigInteger(), nullable=True),
    sa.Column('energy_j', sa.Float(), nullable=True),
    sa.Column('power_mean_w', sa.Float(), nullable=True),
    sa.Column('source', sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('missing', sa.JSON(), nullable=True),
    sa.Column('xid_errors', sa.Integer(), nullable=True),
    sa.Column('throttle_s', sa.JSON(), nullable=True),
    sa.Column('processes', sa.JSON(), nullable=True),
    sa.Column('mig_uuid', sqlmodel.sql.sqltypes.AutoString(length=96), nullable=True),
    sa.Column('mig_profile', sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
    sa.Column('mig_gi_id', sa.Integer(), nullable=True),
    sa.Column('mig_ci_id', sa.Integer(), nullable=True),
    sa.ForeignKeyConstraint(['job_pk'], ['job.id'], name=op.f('fk_job_gpu_job_pk_job'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_job_gpu')),
    sa.UniqueConstraint('job_pk', 'node', 'gpu_index', name='uq_job_gpu_job_node_index')
    )
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_gpu_job_pk'), ['job_pk'], unique=False)

    op.create_table('job_gpu_timeline',
    sa.Column('job_gpu_id', sa.Integer(), nullable=False),
    sa.Column('points', sa.JSON(), nullable=True),
    sa.ForeignKeyConstraint(['job_gpu_id'], ['job_gpu.id'], name=op.f('fk_job_gpu_timeline_job_gpu_id_job_gpu'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('job_gpu_id', name=op.f('pk_job_gpu_timeline'))
    )


def downgrade() -> None:
    op.drop_table('job_gpu_timeline')
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_gpu_job_pk'))

    op.drop_table('job_gpu')
    with op.batch_alter_table('usage_rollup', schema=None) as batch_op:
        batch_op.drop_index('ix_usage_rollup_period_start')

    op.drop_table('usage_rollup')
    op.drop_table('report_optout')
    with op.batch_alter_table('report_log', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_report_log_user'))
        batch_op.drop_index(batch_op.f('ix_report_log_status'))
        batch_op.drop_index(batch_op.f('ix_report_log_job_pk'))
        batch_op.drop_index(batch_op.f('ix_report_log_created_at'))

    op.drop_table('report_log')
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_verdict'))
        batch_op.drop_index(batch_op.f('ix_job_user'))
        batch_op.drop_index(batch_op.f('ix_job_start_time'))
        batch_op.drop_index(batch_op.f('ix_job_job_id'))
        batch_op.drop_index(batch_op.f('ix_job_het_job_id'))
        batch_op.drop_index(batch_op.f('ix_job_end_time'))
        batch_op.drop_index(batch_op.f('ix_job_array_job_id'))
        batch_op.drop_index(batch_op.f('ix_job_analyzed_at'))
        batch_op.drop_index(batch_op.f('ix_job_account'))

    op.drop_table('job')
