"""Database engine: SQLite by default (a plain file path in config), PostgreSQL by URL.

SQLite runs in WAL mode with a busy timeout, so that ingest and readers do not block each other, and
with ``synchronous=FULL``: a commit is on disk when it returns, so ingest may remove a record's spool
file right after (a power cut cannot lose both). The schema comes from storage/migrate.py.

The database holds every user's jobs, so it is private to whoever writes it: a new SQLite file is made
0600 (in a directory made 0700) before SQLite opens it, and SQLite gives its ``-wal``/``-shm`` files the
same mode. A server's password is never in the URL of the config (every user reads that file) but in
``paths.database_password_file``, which must not be readable by every user. A damaged SQLite file raises
:class:`DatabaseDamaged`, an ``OperationalError``: like a server that is down it is the database's
fault, not a record's, so ingest stops and keeps its spool files (storage/writer.py).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sqlite3
from typing import TYPE_CHECKING, Any

import orjson
from sqlalchemy import event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, Engine, ExceptionContext, make_url
from sqlmodel import create_engine

from .. import models  # noqa: F401  (registers the tables on SQLModel.metadata)
from ..config import read_secret
from . import integrity
from .dburl import BUSY_S, database_url, read_uri, sqlite_file

if TYPE_CHECKING:
    from ..config import PathsConfig


def engine_for(paths: PathsConfig, create: bool = True, read_only: bool = False, checking: bool = False,
               busy_s: float | None = None) -> Engine:
    """The engine of ``[paths] database`` with its password file: what every command opens."""
    return make_engine(paths.database, create=create, password_file=paths.database_password_file,
                       read_only=read_only, checking=checking, busy_s=busy_s)


def make_engine(value: str, create: bool = True, *, password_file: str = "", read_only: bool = False,
                checking: bool = False, busy_s: float | None = None) -> Engine:
    """The engine; with ``create``, SQLite's directory is created and the schema made current, and a server
    database raises ``migrate.SchemaError`` until ``gpueff db upgrade`` has run (storage/migrate.py).
    ``read_only``: for readers that never write; on SQLite also for a user who may read the file but not
    write it or its directory (``dburl.read_uri``). A SQLite file the integrity check marked damaged
    raises :class:`DatabaseDamaged` (storage/integrity.py), unless ``checking`` (opened to check it again).

    ``busy_s``: how long a statement waits for a lock another connection holds before it fails with an
    OperationalError ("database is locked"): SQLite's busy timeout (``dburl.BUSY_S`` when not given);
    on a server, given only for requests somebody waits on (dburl.answer_busy_s), the connection's
    timeout and ``lock_timeout``."""
    url = database_url(value)
    sqlite = url.startswith("sqlite")
    path = sqlite_file(url)
    if path and not checking:
        refuse_marked(path)
    if read_only and path:
        uri = read_uri(path)
        wait = BUSY_S if busy_s is None else busy_s
        ro = create_engine("sqlite://", json_serializer=json_dumps, json_deserializer=orjson.loads,
                           creator=lambda: sqlite3.connect(uri, uri=True, timeout=wait, check_same_thread=False))
        event.listen(ro, "handle_error", _sqlite_damage)
        return ro
    if create and path:
        create_private(path)
    target: str | URL = url
    if password_file and not sqlite:
        target = make_url(url).set(password=read_password(password_file))
    engine = create_engine(target, json_serializer=json_dumps, json_deserializer=orjson.loads,
                           connect_args=_busy_args(sqlite, busy_s))
    if sqlite:
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "handle_error", _sqlite_damage)
    else:
        event.listen(engine, "do_connect", _connect)
    if create:
        from .migrate import ensure_schema  # imports Alembic: only for writers, never for seff-gpu

        ensure_schema(engine)
    return engine


def _busy_args(sqlite: bool, busy_s: float | None) -> dict[str, Any]:
    """The driver's arguments that bound its waits (make_engine's ``busy_s``)."""
    if sqlite:
        return {"timeout": BUSY_S if busy_s is None else busy_s}
    if busy_s is None:
        return {}
    return {"connect_timeout": max(1, math.ceil(busy_s)), "options": f"-c lock_timeout={max(1, int(busy_s * 1000))}"}


def create_private(path: str) -> None:
    """Make the SQLite file ``path`` (empty: SQLite takes an empty file for a new database) readable by its
    owner only, and any directory on the way 0700, before SQLite creates it with the umask's mode. An
    existing file or directory is left as it is (``gpueff doctor`` reports one that others may read)."""
    path = os.path.abspath(path)
    missing: list[str] = []
    parent = os.path.dirname(path)
    while not os.path.isdir(parent) and parent != os.path.dirname(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # a concurrent first run made it
            os.mkdir(d, 0o700)
            os.chmod(d, 0o700)  # whatever the umask
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except FileExistsError:
        return
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def read_password(path: str) -> str:
    """The database password: the first line of ``paths.database_password_file`` (its newline stripped).
    A file every user may read is refused: the password would be no more private than in the config."""
    return read_secret(path, "paths.database_password_file", "the database password")


class DatabaseDamaged(sa_exc.OperationalError):
    """A SQLite file that is damaged or not a database at all (SQLITE_CORRUPT, SQLITE_NOTADB). In one line:
    the statement and its parameters belong to no message a user sees."""

    def __str__(self) -> str:
        text = (str(self.orig).strip().splitlines() or ["unreadable"])[0]
        return f"the database file is damaged or not a database ({text})"


def refuse_marked(path: str) -> None:
    """Raise :class:`DatabaseDamaged` for a file the last integrity check found damaged."""
    damage = integrity.found(path)
    if damage is not None:
        raise DatabaseDamaged(None, None, sqlite3.DatabaseError(damage.message(path)))


def check_engine(engine: Engine, limit_s: float) -> tuple[str, str]:
    """integrity.check on a connection of ``engine``; a file too damaged to open a connection is "damaged" too."""
    try:
        with engine.connect() as conn:
            return integrity.check(conn, limit_s)
    except DatabaseDamaged as exc:
        return "damaged", str(exc.orig)


def damaged(exc: BaseException) -> bool:
    """Whether a DBAPI error (or SQLAlchemy's wrapper of one) says the SQLite file is damaged: sqlite3
    raises its base ``DatabaseError`` for exactly these (every other failure has a subclass)."""
    orig = getattr(exc, "orig", None) or exc
    return type(orig) is sqlite3.DatabaseError


def _sqlite_damage(ctx: ExceptionContext) -> BaseException | None:
    if damaged(ctx.original_exception) and not isinstance(ctx.sqlalchemy_exception, DatabaseDamaged):
        return DatabaseDamaged(ctx.statement, ctx.parameters, ctx.original_exception)
    return None


def _connect(dialect: Any, _rec: Any, cargs: Any, cparams: Any) -> Any:
    """Connect; an address the driver cannot even try (a host name IDNA cannot encode, a NUL byte) is the
    driver's connection error too, so that it is reported as a database that cannot be reached.

    PostgreSQL's JIT is off for our sessions: it compiles a query once its estimated cost passes a
    threshold, which a year of an account or a month of the site does, and the compiling took longer than
    these aggregates then saved (``seff-gpu -A``'s totals, a month's rollup)."""
    if dialect.name == "postgresql":
        cparams["options"] = f"{cparams.get('options', '')} -c jit=off".strip()
    try:
        return dialect.connect(*cargs, **cparams)
    except (ValueError, OSError) as exc:  # UnicodeError is a ValueError
        raise dialect.loaded_dbapi.OperationalError(f"cannot connect: {exc}") from exc


def json_dumps(value: object) -> str:
    """Compact JSON for JSON columns (a large share of ingest's per-record work): orjson, or the stdlib for
    what orjson refuses (an integer beyond 64 bits)."""
    with contextlib.suppress(orjson.JSONEncodeError):
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    return json.dumps(value, separators=(",", ":"))


def first_line(exc: BaseException) -> str:
    """A database error in one line: the driver's own message where SQLAlchemy wraps one."""
    if isinstance(exc, DatabaseDamaged):
        return str(exc)
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    for pragma in ("journal_mode=WAL", "foreign_keys=ON", "synchronous=FULL"):
        dbapi_conn.execute(f"PRAGMA {pragma}")
