"""Copy a whole job database into another one: a site's SQLite history into the PostgreSQL database it moves
to (``gpueff db copy``; docs/operations.md).

Every table of the schema is copied row for row, ids included, so that what refers to a row (a GPU row's
job, a timeline's GPU row, a sent-log's job) still does. The destination must be at the schema this
version makes and empty: a destination that holds rows is refused unless ``replace``, which empties it
first. Both sides must be at the same revision, since the copy is by column name. Everything is written in
one transaction: a copy that fails (the server gone, a disk full, Ctrl-C) leaves the destination as it was.
On PostgreSQL the rows go in by ``COPY``, and the id sequences are set past the copied ids (else the next
insert would take id 1 again). The end compares each table's row count on both sides.

JSON columns are read and written as their stored text: SQL NULL and JSON ``null`` stay apart, and no
value is parsed only to be written again. The other columns pass through their types (SQLite keeps a time
as text and a boolean as 0/1; PostgreSQL has types of its own).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Column, Table, Text, cast, func, inspect, select, text
from sqlalchemy import exc as sa_exc
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlmodel import SQLModel

from .. import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from ..errors import GpueffError
from . import migrate
from .writer import raw_errors

CHUNK = 5000  # rows per read and per write: bounded memory whatever the size of a table
Progress = Callable[[int, int], None]


class CopyRefused(GpueffError):
    """The copy cannot start: nothing was written."""


class CopyFailed(Exception):
    """A statement failed while ``table`` was copied (``error``: SQLAlchemy's error); the destination's
    transaction is rolled back."""

    def __init__(self, table: str, error: sa_exc.SQLAlchemyError) -> None:
        super().__init__(table, error)
        self.table, self.error = table, error


@dataclass
class CopyResult:
    """What the copy did: per table the rows read from the source and counted in the destination after it."""

    source: dict[str, int] = field(default_factory=dict)
    destination: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    made_schema: str = ""  # what the migrations did to a destination that had no schema, in words

    @property
    def equal(self) -> bool:
        return self.source == self.destination

    @property
    def rows(self) -> int:
        return sum(self.source.values())


def tables() -> list[Table]:
    """The schema's tables, each after the tables it refers to."""
    return list(SQLModel.metadata.sorted_tables)


def counts(conn: Connection) -> dict[str, int]:
    return {t.name: int(conn.execute(select(func.count()).select_from(t)).scalar_one()) for t in tables()}


def _revision(conn: Connection, side: str) -> str | None:
    try:
        migrate.refuse_foreign(conn)
    except migrate.SchemaError as exc:
        raise CopyRefused(f"the {side}: {exc}") from None
    return migrate.current(conn)


def _check_source(conn: Connection) -> None:
    rev, head = _revision(conn, "source"), migrate.head()
    if rev != head:
        raise CopyRefused(f"the source is at schema revision {rev or '(none)'}, this version's is {head}: "
                          + ("it holds no slurm-gpueff database" if rev is None else
                             "upgrade it first (`gpueff db upgrade` while paths.database names it)"))


def prepare_destination(engine: Engine, replace: bool) -> str:
    """Make an empty destination's schema current; refuse one at another revision, and one that holds rows
    (unless ``replace``). Returns what the migrations did ("" when the schema was there)."""
    with engine.connect() as conn:
        rev = _revision(conn, "destination")
        names = set(inspect(conn).get_table_names())
    made = ""
    if rev is None and not names & set(SQLModel.metadata.tables):
        before, after = migrate.upgrade(engine)
        made = migrate.migrated(before, after)
    elif rev != migrate.head():
        raise CopyRefused(f"the destination is at schema revision {rev or '(none)'}, this version's is "
                          f"{migrate.head()}: run `gpueff db upgrade` on it first")
    with engine.connect() as conn:
        held = {name: n for name, n in counts(conn).items() if n}
    if held and not replace:
        shown = ", ".join(f"{name} {n:,}" for name, n in held.items())
        raise CopyRefused(f"the destination is not empty ({shown} rows): copy into an empty database, or give "
                          "--force to delete what it holds first")
    return made


def copy_database(source: Engine, destination: Engine, *, replace: bool = False,
                  progress: Progress | None = None) -> CopyResult:
    """Copy every table of ``source`` into ``destination`` (see the module's doc); the result says whether
    the row counts agree."""
    if _where(source) == _where(destination):
        raise CopyRefused("the source and the destination are the same database")
    t0 = time.monotonic()
    result = CopyResult()
    with source.connect() as src:
        _check_source(src)
    result.made_schema = prepare_destination(destination, replace)
    with _snapshot(source) as src:
        result.source = counts(src)
        total, done = sum(result.source.values()), 0
        if progress:
            progress(0, total)
        with destination.connect() as dst, dst.begin():
            writer = _Writer(dst)
            if replace:
                for t in reversed(tables()):
                    dst.execute(t.delete())
            for t in tables():
                try:
                    for rows in _read(src, t):
                        writer.write(t, rows)
                        done += len(rows)
                        if progress:
                            progress(done, total)
                except sa_exc.SQLAlchemyError as exc:
                    raise CopyFailed(t.name, exc) from exc
            writer.finish()
    if destination.dialect.name == "postgresql":  # the planner's statistics of the new rows
        with destination.connect().execution_options(isolation_level="AUTOCOMMIT") as dst:
            dst.execute(text("ANALYZE"))
    with destination.connect() as dst:
        result.destination = counts(dst)
    result.seconds = time.monotonic() - t0
    return result


@contextlib.contextmanager
def _snapshot(engine: Engine) -> Iterator[Connection]:
    """A connection whose reads all see the database as of its first one (the counts and the rows agree even
    if something writes meanwhile): SQLite's read transaction, PostgreSQL's REPEATABLE READ."""
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn, conn.begin():
            yield conn
        return
    with engine.connect() as conn, conn.begin():
        conn.connection.cursor().execute("BEGIN")  # pysqlite would begin only at a write
        yield conn


def _where(e: Engine) -> tuple[str | None, ...]:
    """Which database an engine opens: a SQLite file's path, a server's host, port and database name."""
    if e.dialect.name == "sqlite":
        with e.connect() as conn:  # main's file: a connection that used temporary tables lists "temp" too
            files = {name: file for _seq, name, file in conn.exec_driver_sql("PRAGMA database_list")}
            return ("sqlite", os.path.realpath(str(files["main"])))
    u = e.url
    return (e.dialect.name, u.host, str(u.port or 5432), u.database)


def _is_json(c: Column[Any]) -> bool:
    return isinstance(c.type, sqltypes.JSON)


def _read(conn: Connection, table: Table) -> Iterator[list[tuple[Any, ...]]]:
    """The table's rows in primary-key order, CHUNK at a time; JSON columns as their stored text."""
    cols = [cast(c, Text).label(c.name) if _is_json(c) else c for c in table.columns]
    result = conn.execution_options(yield_per=CHUNK).execute(select(*cols).order_by(*table.primary_key.columns))
    for part in result.partitions():
        yield [tuple(r) for r in part]


class _Writer:
    """Rows into the destination's transaction through its DBAPI cursor: COPY on PostgreSQL, executemany on
    SQLite. Values pass through the destination's bind processors (JSON text as it is)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.pg = conn.dialect.name == "postgresql"
        self.cur: Any = conn.connection.cursor()

    def write(self, table: Table, rows: list[tuple[Any, ...]]) -> None:
        """Raises the driver's errors as SQLAlchemy's, as every other statement does."""
        convert = _converters(table, self.conn.dialect)
        if convert:
            rows = [tuple(f(v) if f else v for f, v in zip(convert, r, strict=True)) for r in rows]
        with raw_errors(self.conn):
            self._write(table, rows)

    def _write(self, table: Table, rows: list[tuple[Any, ...]]) -> None:
        names = ", ".join(f'"{c.name}"' for c in table.columns)
        if self.pg:
            with self.cur.copy(f'COPY "{table.name}" ({names}) FROM STDIN') as cp:
                for r in rows:
                    cp.write_row(r)
            return
        marks = ", ".join("?" * len(table.columns))
        self.cur.executemany(f'INSERT INTO "{table.name}" ({names}) VALUES ({marks})', rows)

    def finish(self) -> None:
        """PostgreSQL: each id sequence past the largest copied id (``setval`` to 1 with is_called false on
        an empty table, so that its first id stays 1)."""
        if not self.pg:
            return
        for t in tables():
            pk = list(t.primary_key.columns)
            if len(pk) != 1 or not isinstance(pk[0].type, sqltypes.Integer):
                continue
            seq = self.conn.execute(text("SELECT pg_get_serial_sequence(:t, :c)"),
                                    {"t": f'"{t.name}"', "c": pk[0].name}).scalar()
            if seq:
                self.conn.execute(text(f'SELECT setval(:s, COALESCE(MAX("{pk[0].name}"), 1), MAX("{pk[0].name}") '
                                       f'IS NOT NULL) FROM "{t.name}"'), {"s": seq})


def _converters(table: Table, dialect: Dialect) -> list[Callable[[Any], Any] | None] | None:
    procs: list[Callable[[Any], Any] | None] = [
        None if _is_json(c) else c.type.dialect_impl(dialect).bind_processor(dialect) for c in table.columns]
    return procs if any(procs) else None
