"""rollup_pending: months whose rollups a moved job left stale, recomputed by the next refresh.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 16:07:33.413839
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('rollup_pending',
    sa.Column('month', sa.Date(), nullable=False),
    sa.Column('noted_at', sa.DateTime(), nullable=False),
    sa.PrimaryKeyConstraint('month', name=op.f('pk_rollup_pending'))
    )


def downgrade() -> None:
    op.drop_table('rollup_pending')
