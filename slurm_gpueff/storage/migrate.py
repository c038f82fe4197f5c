"""Schema migrations (Alembic), configured in code: no alembic.ini to install or find.

SQLite (the zero-setup default) is upgraded when ``make_engine(create=True)`` opens it; a file made by
``create_all`` before migrations existed is adopted (stamped) when its tables match the models. On
PostgreSQL nothing changes the schema behind the administrator's back: until ``gpueff db upgrade`` has
run, ``make_engine(create=True)`` raises :class:`SchemaError`, so no node or service writes into an old
schema. Alembic is imported only here, lazily: ``seff-gpu`` (``create=False``) never pays for it.

Upgrades are serialised: two first runs on a new SQLite file (two ingests started together), or two
``gpueff db upgrade`` on one server, would otherwise both see no schema and both create it. The upgrade
holds SQLite's write lock (``BEGIN EXCLUSIVE``) or a PostgreSQL transaction-level advisory lock from its
first read of the revision to its commit; the second then finds the schema made. A database that holds
other tables and no revision is another program's: it is refused, never filled with ours.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection, Engine
from sqlmodel import SQLModel

from .. import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from ..errors import GpueffError

log = logging.getLogger(__name__)
# pg_advisory_xact_lock key of schema upgrades ("gpueff" in ASCII): any constant that other programs do not use.
PG_LOCK = 0x677075656666
MIGRATIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "migrations")


class SchemaError(GpueffError):
    """The database schema is not the one this version needs (run ``gpueff db upgrade``)."""


def alembic_config(connection: Connection | None = None) -> Any:
    """An Alembic Config pointing at the packaged migrations (and at ``connection`` when given)."""
    from alembic.config import Config

    cfg = Config(attributes={"connection": connection})
    cfg.set_main_option("script_location", MIGRATIONS)
    return cfg


@functools.cache
def head() -> str:
    """The newest revision of the packaged migrations (Alembic raises while they have several heads)."""
    from alembic.script import ScriptDirectory

    return str(ScriptDirectory.from_config(alembic_config()).get_current_head())


def current(conn: Connection) -> str | None:
    """The database's revision (None: not under Alembic, e.g. empty or made by create_all)."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(conn).get_current_revision()


def known(revision: str) -> bool:
    """Whether ``revision`` names a revision of the packaged migrations (or ``head``)."""
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    try:
        return ScriptDirectory.from_config(alembic_config()).get_revision(revision) is not None
    except (CommandError, ValueError, KeyError):
        return False


def foreign_tables(conn: Connection) -> list[str]:
    """Tables that are not slurm-gpueff's in a database without a revision: another program's database."""
    if current(conn) is not None:
        return []
    ours = {*SQLModel.metadata.tables, "alembic_version"}
    return sorted(t for t in inspect(conn).get_table_names() if t not in ours)


def refuse_foreign(conn: Connection) -> None:
    others = foreign_tables(conn)
    if others:
        shown = ", ".join(others[:5]) + (", ..." if len(others) > 5 else "")
        raise SchemaError(f"not a slurm-gpueff database: it holds other tables ({shown}) and no slurm-gpueff "
                          "schema revision; give paths.database a database of its own")


def upgrade(engine: Engine, revision: str = "head") -> tuple[str | None, str | None]:
    """Migrate to ``revision``; returns (before, after). Adopts a matching pre-Alembic schema first. Holds
    the database's write lock (see module doc) from reading the revision to the commit."""
    from alembic import command
    from alembic.util import CommandError

    with engine.connect() as conn:
        # SQLite migrations copy a table to alter it; dropping the old copy must not cascade into the rows
        # that reference it (the pragma is a no-op inside a transaction, hence before it, and restored after).
        sqlite = conn.dialect.name == "sqlite"
        if sqlite:
            conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
            conn.commit()
        try:
            with conn.begin():
                if sqlite:  # pysqlite would begin only at the first write, after the read of the revision
                    conn.connection.cursor().execute("BEGIN EXCLUSIVE")
                elif conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_LOCK})
                before = current(conn)
                refuse_foreign(conn)
                if before is None and "job" in inspect(conn).get_table_names():  # made by create_all
                    _adopt(conn)
                try:
                    command.upgrade(alembic_config(conn), revision)
                except CommandError as exc:  # an unknown revision in the database, or a target behind it
                    raise SchemaError(f"cannot upgrade from revision {before} to {revision}: {exc}") from None
        finally:
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                conn.commit()
    with engine.connect() as conn:
        return before, current(conn)


def migrated(before: str | None, after: str | None) -> str:
    """What an upgrade from ``before`` to ``after`` did, in words: "migrated from 0011 (2 migrations: 0012,
    0013)", "made new (13 migrations: 0001 to 0013)", "nothing to migrate"."""
    from alembic.script import ScriptDirectory

    if before == after:
        return "nothing to migrate"
    script = ScriptDirectory.from_config(alembic_config())
    steps = [r.revision for r in script.iterate_revisions(after or "base", before or "base")][::-1]
    ids = ", ".join(steps) if len(steps) <= 3 else f"{steps[0]} to {steps[-1]}"
    n = f"{len(steps)} migration{'' if len(steps) == 1 else 's'}: {ids}"
    return f"migrated from {before} ({n})" if before else f"made new ({n})"


def diffs(conn: Connection) -> list[Any]:
    """Differences between the database and models.py (Alembic autogenerate's view); [] = identical."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    ctx = MigrationContext.configure(conn, opts={"compare_type": True})
    return list(compare_metadata(ctx, SQLModel.metadata))


def ensure_schema(engine: Engine) -> None:
    """``make_engine(create=True)``: upgrade SQLite on open; on a server only check (see module doc).

    On a new SQLite file SQLite can answer "database is locked" at once, without its busy wait, while
    another process turns the empty file into a WAL database: retried for up to 30 s."""
    import time

    from sqlalchemy.exc import OperationalError

    deadline = time.monotonic() + 30
    while True:
        try:
            _ensure_schema(engine)
            return
        except OperationalError as exc:
            locked = engine.dialect.name == "sqlite" and "database is locked" in str(exc.orig)
            if not locked or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _ensure_schema(engine: Engine) -> None:
    """Logs one INFO line, the schema's revision and what was migrated (Alembic's own lines, one or two per
    migration and per context, are left to ``-v``: cli.common.log_to_stderr)."""
    with engine.connect() as conn:
        rev = current(conn)
    if rev == head():
        log.info("database schema: revision %s, nothing to migrate", rev)
        return
    if engine.dialect.name == "sqlite":
        before, after = upgrade(engine)
        log.info("database schema: revision %s, %s", after, migrated(before, after))
        return
    url = engine.url.render_as_string(hide_password=True)
    state = f"is at revision {rev}" if rev else "has no slurm-gpueff schema yet"
    raise SchemaError(f"the database {url} {state}; this version needs {head()}: run `gpueff db upgrade` "
                      "on the service host")


def _adopt(conn: Connection) -> None:
    """A database made by create_all before migrations existed: stamp it if it matches, else refuse."""
    from alembic import command

    missing = set(SQLModel.metadata.tables) - set(inspect(conn).get_table_names())
    if missing:  # older create_all schema: tables that later versions added are simply created
        SQLModel.metadata.create_all(conn, tables=[SQLModel.metadata.tables[t] for t in sorted(missing)])
    left = diffs(conn)
    if left:
        shown = "; ".join(str(d) for d in left[:5])
        raise SchemaError(f"this database was created without migrations and differs from the current schema "
                          f"({len(left)} difference(s): {shown}); export and re-ingest, or migrate it by hand")
    command.stamp(alembic_config(conn), "head")


if __name__ == "__main__":  # pragma: no cover - a developer tool (slurm_gpueff/migrations/__init__.py)
    import tempfile

    from alembic import command
    from sqlalchemy import create_engine

    if len(sys.argv) != 3 or sys.argv[1] != "revision":
        sys.exit("usage: python3 -m slurm_gpueff.storage.migrate revision MESSAGE")
    with tempfile.TemporaryDirectory() as d:  # autogenerate against a freshly migrated SQLite
        engine = create_engine("sqlite:///" + os.path.join(d, "rev.db"))
        upgrade(engine)
        with engine.begin() as conn:
            command.revision(alembic_config(conn), message=sys.argv[2], autogenerate=True)
