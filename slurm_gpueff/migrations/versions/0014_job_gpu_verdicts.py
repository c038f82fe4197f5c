"""job.gpu_verdicts: the verdicts of a job's GPUs where they differ from its primary verdict.

A monthly summary counted a job's GPU-hours under its primary verdict: "GPU never used: 2 jobs, 19.50
GPU-h" where one of the jobs had used its fourth GPU fully. With each GPU under its own first verdict the
summary counts GPUs. Nullable JSON, NULL where every GPU has the job's verdict (every one-GPU job). The
jobs whose GPUs may differ (more than one GPU, a verdict other than healthy) are marked for analysis again,
which writes it; the service does that in its next ingest runs, and the rollups of their months follow.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-29 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gpu_verdicts', sa.JSON(), nullable=True))
    op.execute("UPDATE job SET analyzed_at = NULL WHERE gpu_count > 1 AND verdict IS NOT NULL "
               "AND verdict <> 'healthy'")


def downgrade() -> None:
    with op.batch_alter_table('job', schema=None) as batch_op:
        batch_op.drop_column('gpu_verdicts')
