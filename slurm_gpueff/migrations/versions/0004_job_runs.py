"""job.run and job.sluid: a row per run of a requeued job, unique on (cluster, job_id, run).

Existing rows are each a job's only kept run and become run 0 (the server default); the old unique key
on (cluster, job_id) is replaced by one that includes the run.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 18:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('run', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('sluid', sa.String(length=32), nullable=True))
        batch_op.drop_constraint('uq_job_cluster_job_id', type_='unique')
        batch_op.create_unique_constraint('uq_job_cluster_job_id_run', ['cluster', 'job_id', 'run'])


def downgrade() -> None:
    # Keeps one row per job (the latest run), as this schema could hold nothing else.
    op.execute("DELETE FROM job WHERE EXISTS (SELECT 1 FROM job AS later WHERE later.cluster = job.cluster "
               "AND later.job_id = job.job_id AND later.run > job.run)")
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_constraint('uq_job_cluster_job_id_run', type_='unique')
        batch_op.create_unique_constraint('uq_job_cluster_job_id', ['cluster', 'job_id'])
        batch_op.drop_column('sluid')
        batch_op.drop_column('run')
