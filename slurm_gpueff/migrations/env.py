"""Alembic environment: the models' metadata, a connection handed in by slurm_gpueff.storage.migrate.

There is no alembic.ini (migrate.alembic_config configures Alembic in code), hence no URL to connect to
and no offline (``--sql``) mode.
"""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import slurm_gpueff.models  # noqa: F401 - puts the tables (and their naming convention) on SQLModel.metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("the migrations run on the connection slurm_gpueff.storage.migrate hands in")
context.configure(
    connection=connection,
    target_metadata=SQLModel.metadata,
    render_as_batch=connection.dialect.name == "sqlite",  # SQLite cannot ALTER most things: copy-and-move
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
