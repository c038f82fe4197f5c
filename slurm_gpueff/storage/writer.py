"""Ingest's SQL: read a batch's stored rows, merge them (storage/merge.py), write the result.

Reads go through SQLAlchemy Core. Writes go through the DBAPI cursor of the same transaction, because
building Core's parameters for thousands of wide rows cost most of ingest's time: ``executemany`` on
SQLite, ``COPY`` on PostgreSQL. Values pass through the columns' own bind processors, so the stored text
is what Core would store. The database assigns new rows' ids; they are read back by natural key, which
unique constraints guarantee. Every difference between the two dialects is in :class:`_Sql` and
:func:`transaction`.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from operator import itemgetter
from typing import Any

from sqlalchemy import Table, select
from sqlalchemy import exc as sa_exc
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.types import TypeEngine
from sqlmodel import Session

from .. import record as recmod
from ..models import Job, utcnow
from .db import DatabaseDamaged, damaged
from .merge import Key, Row, Spot, job_key, merge
from .rollups import moved_month, note_moved

# The database is unavailable (not the record's fault): stop, keep the files, try again next run. A damaged
# or foreign SQLite file is one too (DatabaseDamaged, raised for sqlite's base DatabaseError by storage.db):
# quarantining every record that meets a corrupt page would empty the spool into quarantine.
UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError, sa_exc.TimeoutError,
               DatabaseDamaged)
IN_CHUNK = 500  # bound parameters per IN (...) query: well under SQLite's and PostgreSQL's limits
_JOB, _GPU, _TIMELINE = (Job.metadata.tables[t] for t in ("job", "job_gpu", "job_gpu_timeline"))


@contextlib.contextmanager
def transaction(engine: Engine) -> Iterator[Connection]:
    """One ingest transaction, holding off other writers from its first read to its commit.

    SQLite: ``BEGIN IMMEDIATE`` takes the write lock before the read the merge starts from (the
    sqlite3 module would begin only at the first write). PostgreSQL: the stored job rows are read
    ``FOR UPDATE``; a job another writer inserts meanwhile fails the unique key, and the transaction
    is retried. Durable at commit on both: PostgreSQL by default, SQLite by the engine's
    ``synchronous=FULL`` (:mod:`slurm_gpueff.storage.db`), so a record's file may go right after.
    """
    with engine.connect() as conn, conn.begin():
        if conn.dialect.name == "sqlite":
            with raw_errors(conn):
                conn.connection.cursor().execute("BEGIN IMMEDIATE")
        yield conn


def write_records(conn: Connection, recs: list[Row]) -> None:
    """Upsert validated node records in ``conn``'s transaction: idempotent, independent of node order."""
    if not recs:
        return
    jobs, gpus = read_stored(conn, {job_key(r) for r in recs})
    plan = merge(recs, jobs, gpus, utcnow())
    # A later node record that moves a job's end into another month makes the old month's rollups stale:
    # noted for the next refresh (storage/rollups.py).
    note_moved(conn, [old["end_time"] for k, old in plan.old_jobs.items()
                      if moved_month(old["end_time"], plan.jobs[k]["end_time"])])
    with raw_errors(conn):
        db = _Sql(conn)
        db.insert_ids(_JOB, [row for k, row in plan.jobs.items() if k not in plan.old_jobs],
                      ("cluster", "job_id", "run"), by="job_id")
        db.update(_JOB, [plan.jobs[k] for k in plan.old_jobs if plan.jobs[k] != plan.old_jobs[k]])
        inserts, updates, gone = plan.gpu_changes()
        redone = sorted(r["id"] for r in updates if r["id"] not in plan.kept)  # a kept row keeps its timeline
        db.delete_in("job_gpu_timeline", "job_gpu_id", gone + redone)
        db.delete_in("job_gpu", "id", gone)  # after their timelines: no reliance on FK cascades
        db.update(_GPU, updates)
        db.insert_ids(_GPU, inserts, ("job_pk", "node", "gpu_index"), by="job_pk")
        db.insert(_TIMELINE, plan.timeline_rows())


def read_stored(conn: Connection, keys: set[Key]) -> tuple[dict[Key, Row], dict[Key, dict[Spot, Row]]]:
    """The stored job rows of ``keys`` and every live row of their jobs (the run an Epilog without its Prolog
    state may end: merge.live_run_of), locked on PostgreSQL, and their GPU rows by (node, GPU index)."""
    jobs: dict[Key, Row] = {}
    for part in _chunks(sorted({k[1] for k in keys})):
        stmt = select(_JOB).where(_JOB.c.job_id.in_(part)).order_by(_JOB.c.id).with_for_update()
        for row in conn.execute(stmt).mappings():
            key = (row["cluster"], row["job_id"], row["run"])
            if key in keys or row["record_source"] == "live":
                jobs[key] = dict(row)
    gpus: dict[Key, dict[Spot, Row]] = {k: {} for k in jobs}
    by_pk = {v["id"]: k for k, v in jobs.items()}
    for part in _chunks(sorted(by_pk)):
        for row in conn.execute(select(_GPU).where(_GPU.c.job_pk.in_(part)).order_by(_GPU.c.id)).mappings():
            gpus[by_pk[row["job_pk"]]][(row["node"], row["gpu_index"])] = dict(row)
    return jobs, gpus


def ingest_record(session: Session, rec: Row) -> Job:
    """Upsert one node record in the session's transaction (sacct enrichment's backfill)."""
    recmod.validate(rec)
    write_records(session.connection(), [rec])
    session.expire_all()  # rows changed underneath the ORM
    cluster, job_id, run = job_key(rec)
    return session.scalars(select(Job).where(_JOB.c.cluster == cluster, _JOB.c.job_id == job_id,
                                             _JOB.c.run == run)).one()


@contextlib.contextmanager
def raw_errors(conn: Connection) -> Iterator[None]:
    """Raise DBAPI errors of raw statements as SQLAlchemy would (OperationalError, IntegrityError, ...),
    so that callers tell an unavailable database from a rejected record the same way on every path."""
    dbapi_error = conn.dialect.loaded_dbapi.Error
    try:
        yield
    except dbapi_error as exc:
        if damaged(exc):
            raise DatabaseDamaged(None, None, exc) from exc
        raise sa_exc.DBAPIError.instance(None, None, exc, dbapi_error, dialect=conn.dialect,
                                         connection_invalidated=conn.dialect.is_disconnect(exc, None, None),
                                         ) from exc


def _chunks(values: list[Any]) -> Iterator[list[Any]]:
    for i in range(0, len(values), IN_CHUNK):
        yield values[i:i + IN_CHUNK]


class _Columns:
    """A table's columns (``id`` apart) with their dialect's bind processors, for raw DBAPI statements."""

    def __init__(self, table: Table, dialect: Dialect) -> None:
        self.cols = [c.name for c in table.columns if c.name != "id"]
        self.quoted = ", ".join(f'"{c}"' for c in self.cols)
        procs = [_bind_processor(table.c[c].type, dialect) for c in self.cols]
        self.convert: list[tuple[int, Callable[[Any], Any]]] = [(i, p) for i, p in enumerate(procs) if p]
        self.get = itemgetter(*self.cols)  # merged and stored rows carry every column: one C call

    def values(self, row: Row) -> list[Any]:
        vals = list(self.get(row))
        for i, proc in self.convert:
            vals[i] = proc(vals[i])
        return vals


def _bind_processor(col_type: TypeEngine[Any], dialect: Dialect) -> Callable[[Any], Any] | None:
    """The column type's bind processor, made cheaper for ingest's values; same output. JSON: the engine's
    serializer, with the values most rows hold (null, and ``{}`` for "nothing missing") from constants.
    DateTime, where the dialect formats it (SQLite): memoised, as a batch repeats few distinct times (a
    record's start and end are on its job and on each of its GPU rows)."""
    proc = col_type.dialect_impl(dialect).bind_processor(dialect)
    ser = getattr(dialect, "_json_serializer", None)
    if isinstance(col_type, sqltypes.JSON) and ser is not None and not col_type.none_as_null:
        null, empty = ser(None), ser({})
        return lambda v: null if v is None else empty if v.__class__ is dict and not v else ser(v)
    if proc is not None and isinstance(col_type, sqltypes.DateTime):
        return functools.cache(proc)
    return proc


class _Sql:
    """The DBAPI cursor of the SQLAlchemy connection's transaction (commit and rollback stay with it)."""

    def __init__(self, conn: Connection) -> None:
        if conn.dialect.name not in ("sqlite", "postgresql"):
            raise ValueError(f"ingest writes to SQLite or PostgreSQL, not {conn.dialect.name}")
        self.pg = conn.dialect.name == "postgresql"
        self.ph = "%s" if self.pg else "?"
        self.cur: Any = conn.connection.cursor()
        self.columns = {t.name: _Columns(t, conn.dialect) for t in (_JOB, _GPU, _TIMELINE)}

    def marks(self, n: int) -> str:
        return ", ".join([self.ph] * n)

    def insert(self, table: Table, rows: list[Row]) -> None:
        if not rows:
            return
        t = self.columns[table.name]
        if self.pg:
            with self.cur.copy(f'COPY "{table.name}" ({t.quoted}) FROM STDIN') as cp:
                for row in rows:
                    cp.write_row(t.values(row))
            return
        self.cur.executemany(f'INSERT INTO "{table.name}" ({t.quoted}) VALUES ({self.marks(len(t.cols))})',
                             [t.values(row) for row in rows])

    def insert_ids(self, table: Table, rows: list[Row], key: tuple[str, ...], by: str) -> None:
        """Insert ``rows`` and set each one's "id" to the database's, read back by the natural key ``key``.
        The read-back selects on ``by``, an indexed column of the key that names few rows (a job id, a
        job's pk): selecting on the key's first column (the cluster) would read every job of the cluster,
        making each batch's cost grow with the database."""
        self.insert(table, rows)
        ids: dict[tuple[Any, ...], int] = {}
        query = f'SELECT id, {", ".join(key)} FROM "{table.name}" WHERE "{by}" IN'
        for part in _chunks(sorted({r[by] for r in rows})):
            self.cur.execute(f"{query} ({self.marks(len(part))})", part)
            ids.update((tuple(r[1:]), r[0]) for r in self.cur.fetchall())
        get = itemgetter(*key)
        for row in rows:
            row["id"] = ids[get(row)]

    def update(self, table: Table, rows: list[Row]) -> None:
        if not rows:
            return
        t = self.columns[table.name]
        sets = ", ".join(f'"{c}" = {self.ph}' for c in t.cols)
        self.cur.executemany(f'UPDATE "{table.name}" SET {sets} WHERE id = {self.ph}',
                             [[*t.values(r), r["id"]] for r in rows])

    def delete_in(self, table: str, col: str, ids: list[int]) -> None:
        for part in _chunks(ids):
            self.cur.execute(f'DELETE FROM "{table}" WHERE "{col}" IN ({self.marks(len(part))})', part)
