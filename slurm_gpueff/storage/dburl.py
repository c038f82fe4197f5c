"""The database setting as a URL, and the SQLite file behind it (stdlib only: seff-gpu's fast path uses it)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

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
