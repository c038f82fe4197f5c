"""Where the job database is and how long one waits for it: the setting as a URL, the SQLite file behind it and
its URI for readers, the busy waits (stdlib only: seff-gpu's fast path uses it)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING
from urllib.parse import quote

if TYPE_CHECKING:
    from ..config import Config


def database_url(value: str) -> str:
    """Turn the config value into a SQLAlchemy URL (a bare path means a SQLite file)."""
    return value if "://" in value else "sqlite:///" + os.path.abspath(value)


def sqlite_file(url: str) -> str | None:
    """The database file of a ``sqlite:///`` URL (query string dropped); None for other URLs and memory."""
    if not url.startswith("sqlite:///"):
        return None
    path = url[len("sqlite:///"):].split("?", 1)[0]
    return None if path in ("", ":memory:") else path  # "/dir/:memory:" is a file (the fuzzer found one)


def safe_url(url: str) -> str:
    """A database URL as it may be printed: without its password (SQLAlchemy loaded only for a URL)."""
    if "://" not in url:
        return url
    try:
        from sqlalchemy.engine import make_url

        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not a URL SQLAlchemy parses: shown as written (the config refuses a password in it)
        return url


def owner(config: Config) -> int | None:
    """The account the job database belongs to, as this host sees it: the SQLite file's owner, else the
    owner of the server's password file (the service's account keeps it); None when neither tells."""
    path = sqlite_file(database_url(config.paths.database)) or config.paths.database_password_file
    try:
        return os.stat(path).st_uid if path else None
    except OSError:
        return None


def shown_here(config: Config) -> bool:
    """Whether whoever runs this process may be told where the job database is and what its driver says when
    it fails (access.privacy.admin: root, the database's owner, ``[privacy] admins``)."""
    from ..access.privacy import admin, user_name

    return admin(config, os.getuid(), user_name(os.getuid()), owner(config))


# What everybody but the administrators is told when the database fails.
UNAVAILABLE = "the job database is unavailable right now: try again later (the administrators see why: gpueff doctor)"


BUSY_S = 30.0  # how long a batch writer or reader (ingest, rollups, reports) waits for a locked SQLite file
ANSWER_BUSY_SHARE = 0.25  # of [service] api_timeout_s: how long an answer waits for it


def answer_busy_s(api_timeout_s: float) -> float:
    """How long a request that somebody waits on (a seff-gpu answer, a node's push through the API) waits for
    a locked database: a quarter of the clients' ``[service] api_timeout_s``, so that the service's "busy"
    (503, one line, the client retries) reaches the client before it stops waiting, with the rest of its
    time left for the push's turn (service/api.py's push slots, half of it at most), the credential and the
    answer. Waiting as long as a batch writer did (30 s) made every node give up ("timed out") first."""
    return api_timeout_s * ANSWER_BUSY_SHARE


def read_uri(path: str) -> str:
    """The sqlite3 URI for reading the database file ``path``, also for users who may not write it.

    SQLite in WAL mode normally needs write access to the file's directory (for ``-wal``/``-shm``),
    which a site does not give its users. A user who cannot write the file or its directory opens it
    ``mode=ro`` while a writer is connected (``-wal`` and ``-shm`` exist: SQLite >= 3.22 reads a WAL
    database read-only then), else ``immutable=1`` (nothing is writing: no locks, no side files; a
    writer starting during the lookup can at worst make the read fail, never harm the database).
    """
    path = os.path.abspath(path)
    if os.access(path, os.W_OK) and os.access(os.path.dirname(path), os.W_OK):
        return f"file:{quote(path)}"
    live = os.path.exists(path + "-wal") and os.path.exists(path + "-shm")
    return f"file:{quote(path)}?{'mode=ro' if live else 'immutable=1'}"
