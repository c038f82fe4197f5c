"""Alembic migrations of the job database (SQLite and PostgreSQL).

Run them with ``gpueff db upgrade`` (or :func:`slurm_gpueff.storage.migrate.upgrade`); there is no
alembic.ini: :func:`slurm_gpueff.storage.migrate.alembic_config` configures Alembic in code. To add a
migration after changing ``models.py``::

    python3 -m slurm_gpueff.storage.migrate revision "add foo to job"   # autogenerate, then review it

``tests/test_migrations.py`` fails while the migrated schema differs from ``models.py``.
"""
