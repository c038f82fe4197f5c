"""Drop ix_job_gpu_job_pk: the unique (job_pk, node, gpu_index) index already serves job_pk lookups.

Every job-GPU row paid for maintaining both B-trees at ingest; lookups by job (seff-gpu, summaries, the
ON DELETE CASCADE from job) use the unique index's leading column on SQLite and PostgreSQL alike.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22 17:25:00
"""

from __future__ import annotations

from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_gpu_job_pk'))


def downgrade() -> None:
    with op.batch_alter_table('job_gpu', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_gpu_job_pk'), ['job_pk'], unique=False)
