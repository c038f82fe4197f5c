"""The database setting as a URL, and the SQLite file behind it (stdlib only: seff-gpu's fast path uses it)."""

from __future__ import annotations

import os


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
