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

import sqlite3

from sqlalchemy.engine import Engine
from sqlmodel import create_engine

from .db import make_engine
from .dburl import database_url, sqlite_file
from .sqlite_read import read_uri


def make_read_engine(value: str) -> Engine:
    path = sqlite_file(database_url(value))
    if path is None:
        return make_engine(value, create=False)
    uri, read_only = read_uri(path)
    if not read_only:
        return make_engine(value, create=False)
    return create_engine("sqlite://", creator=lambda: sqlite3.connect(uri, uri=True, timeout=30))
