"""The rows an answer reads: the jobs an id names with their GPU rows, and their timelines.

SQLite is read with the standard library (seff/sqlite_read.py: the same rows without importing SQLAlchemy,
which was most of seff-gpu's run time); database servers through SQLAlchemy, imported only on that path.
Every database problem is :class:`Unavailable` (one line; its detail for administrators only).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..storage.dburl import answer_busy_s, database_url, safe_url, sqlite_file
from . import sqlite_read
from .query import Unavailable

if TYPE_CHECKING:
    from sqlmodel import Session

    from ..config import Config
    from ..readmodel import GpuRow, JobRow, Points
    from ..slurm.jobid import JobSpec
    from ..storage.jobmatch import RawIds


def lookup(config: Config, spec: JobSpec | RawIds, cluster: str | None) -> list[tuple[JobRow, list[GpuRow]]]:
    """(job, its GPU rows) for every match. Raises :class:`Unavailable` on DB problems."""
    path = sqlite_file(database_url(config.paths.database))
    if path is not None:
        if not os.path.exists(path):
            raise Unavailable(f"the job database {path} does not exist yet (paths.database in the config; "
                              "`gpueff ingest` creates it)")
        try:
            return sqlite_read.lookup(path, spec, cluster, answer_busy_s(config.service.api_timeout_s))
        except sqlite3.Error as exc:
            raise Unavailable(f"cannot read the job database {path}: {exc}") from None
    from ..storage.queries import find_jobs, job_gpus

    with orm_session(config) as session:
        jobs = find_jobs(session, spec, cluster)
        return [(j, job_gpus(session, j)) for j in jobs]


def timelines(config: Config, found: Sequence[tuple[JobRow, list[GpuRow]]]) -> dict[int, dict[tuple[str, int], Points]]:
    """Each job's GPU timelines by ``id(job)``, then by (node, GPU index), as the renderers take them; read
    as :func:`lookup` reads the rows. Refused on a database problem."""
    rows = [g for _j, gpus in found for g in gpus if g.id is not None]
    by_id = _read_timelines(config, rows) if rows else {}
    return {id(job): {(g.node, g.gpu_index): by_id[g.id] for g in gpus if g.id in by_id} for job, gpus in found}


def _read_timelines(config: Config, gpus: list[GpuRow]) -> dict[int, Points]:
    path = sqlite_file(database_url(config.paths.database))
    if path is not None:
        try:
            ids = [g.id for g in gpus if g.id is not None]
            return sqlite_read.timelines(path, ids, answer_busy_s(config.service.api_timeout_s))
        except sqlite3.Error as exc:
            raise Unavailable(f"cannot read the job database {path}: {exc}") from None
    from ..storage.queries import gpu_timelines

    with orm_session(config) as session:
        return gpu_timelines(session, gpus)


@contextlib.contextmanager
def orm_session(config: Config) -> Iterator[Session]:
    """A session on a read-only engine of the configured database (every table, and a server's cards); any
    database error in it is :class:`Unavailable`."""
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    engine = _engine(config)
    try:
        with Session(engine) as session:
            yield session
    except SQLAlchemyError as exc:
        raise Unavailable(_db_error(config, exc)) from None
    finally:
        _done(engine)


_KEPT: dict[str, Any] = {}  # database URL -> its engine, in a process that keeps them (keep_engines)
_KEEP = threading.Lock()
_keeping = False


def keep_engines() -> None:
    """From now on this process keeps its read-only engines: ``gpueff serve`` answers many queries, and a kept
    engine reuses its pooled connections and compiled statements, where a new engine per answer paid a
    connection and a compilation of every statement each time. seff-gpu answers once, so it makes one and
    disposes of it."""
    global _keeping  # noqa: PLW0603 - one switch for the process's life
    _keeping = True


def _engine(config: Config) -> Any:
    """A read-only engine of the configured database (with its password file); Refused if it cannot open.
    Give it back with :func:`_done`."""
    from ..storage.db import engine_for

    url = database_url(config.paths.database)
    with _KEEP:
        if _keeping and url in _KEPT:
            return _KEPT[url]
        try:
            engine = engine_for(config.paths, create=False, read_only=True,
                                busy_s=answer_busy_s(config.service.api_timeout_s))
        except Exception as exc:  # bad URL, missing driver, unreadable password file
            raise Unavailable(f"cannot open the job database {safe_url(url)}: {exc}") from None
        if _keeping:
            _KEPT[url] = engine
        return engine


def _done(engine: Any) -> None:
    if engine not in _KEPT.values():
        engine.dispose()


def _db_error(config: Config, exc: BaseException) -> str:
    from ..storage.db import first_line

    return f"cannot read the job database {safe_url(config.paths.database)}: {first_line(exc)}"
