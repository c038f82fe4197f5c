"""An engine for readers that may not write the SQLite database: ``seff-gpu`` run by ordinary users.

SQLite in WAL mode normally needs write access to the database's directory (for ``-wal``/``-shm``),
which a site does not give its users. So for a user who cannot write the file or its directory:

* no ``PRAGMA journal_mode=WAL`` (that is a write);
* while a writer is connected (``-wal`` and ``-shm`` exist) the file is opened ``mode=ro``: SQLite
  >= 3.22 reads a WAL database read-only when those files exist and are readable;
* with neither file present nothing is writing, and the file is opened ``immutable=1`` (no locks,
  no side files). A writer starting during the few milliseconds of a lookup can at worst make the
  read fail; readers never write, so the database cannot be harmed.

Anyone who can write (root, the ingest service) gets the normal engine of ``storage.db``.
"""

from __future__ import annotations

import os
import sqlite3
from urllib.parse import quote

from sqlalchemy.engine import Engine
from sqlmodel import create_engine

from .db import database_url, make_engine


def make_read_engine(value: str) -> Engine:
    url = database_url(value)
    if not url.startswith("sqlite:///") or url.endswith(":memory:"):
        return make_engine(value, create=False)
    path = os.path.abspath(url[len("sqlite:///"):].split("?", 1)[0])
    if os.access(path, os.W_OK) and os.access(os.path.dirname(path), os.W_OK):
        return make_engine(value, create=False)
    live = os.path.exists(path + "-wal") and os.path.exists(path + "-shm")
    uri = f"file:{quote(path)}?{'mode=ro' if live else 'immutable=1'}"
    return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, timeout=30))
