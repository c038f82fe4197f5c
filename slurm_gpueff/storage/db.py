"""Database engine: SQLite by default (a plain file path in config), PostgreSQL by URL.

SQLite runs in WAL mode with a busy timeout, so that ingest and readers do not block each other, and
with ``synchronous=FULL``: a commit is on disk when it returns, so ingest may remove a record's spool
file right after (a power cut cannot lose both). The schema comes from storage/migrate.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlmodel import create_engine

from .. import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from .dburl import database_url, sqlite_file

if TYPE_CHECKING:
    from ..config import PathsConfig


def engine_for(paths: PathsConfig, create: bool = True, read_only: bool = False) -> Engine:
    """The engine of ``[paths] database`` with its password file: what every command opens."""
    return make_engine(paths.database, create=create, password_file=paths.database_password_file,
                       read_only=read_only)


def make_engine(value: str, create: bool = True, *, password_file: str = "", read_only: bool = False) -> Engine:
    """The engine; with ``create``, SQLite's directory is created and the schema made current, and a server
    database raises ``migrate.SchemaError`` until ``gpueff db upgrade`` has run (storage/migrate.py).
    ``read_only``: for readers that never write; on SQLite also for a user who may read the file but not
    write it or its directory (``sqlite_read.read_uri``)."""
    url = database_url(value)
    sqlite = url.startswith("sqlite")
    path = sqlite_file(url)
    if read_only and path:
        from .sqlite_read import read_uri

        uri = read_uri(path)
        return create_engine("sqlite://", json_serializer=json_dumps, json_deserializer=orjson.loads,
                             creator=lambda: sqlite3.connect(uri, uri=True, timeout=30, check_same_thread=False))
    if create and path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    engine = create_engine(url, json_serializer=json_dumps, json_deserializer=orjson.loads,
                           connect_args={"timeout": 30} if sqlite else {})
    if sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
    if create:
        from .migrate import ensure_schema  # imports Alembic: only for writers, never for seff-gpu

        ensure_schema(engine)
    return engine


def json_dumps(value: object) -> str:
    """Compact JSON for JSON columns (a large share of ingest's per-record work): orjson, or the stdlib for
    what orjson refuses (an integer beyond 64 bits)."""
    with contextlib.suppress(orjson.JSONEncodeError):
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    return json.dumps(value, separators=(",", ":"))


def first_line(exc: BaseException) -> str:
    """A database error in one line: the driver's own message where SQLAlchemy wraps one."""
    text = str(getattr(exc, "orig", None) or exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=FULL"):
        dbapi_conn.execute(f"PRAGMA {pragma}")
