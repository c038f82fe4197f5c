"""seff-gpu's fast path on SQLite: one job's rows with the standard library's sqlite3, no SQLAlchemy.

``seff-gpu JOBID`` spent ~90 % of its time importing SQLAlchemy, SQLModel and pydantic (bench/seff_latency.py).
For the common case, SQLite and a terminal or ``--json`` card, this module reads the job and GPU rows
directly. The rows it returns carry the same values the ORM gives (checked column by column in
tests/test_sqlite_read.py): every column of the table as an attribute, converted by the column's
declared type (``DATETIME`` -> naive UTC datetime as SQLAlchemy stores it, ``BOOLEAN`` -> bool, ``JSON``
-> decoded, ``DATE`` -> date). Which rows a job id names comes from :mod:`storage.jobmatch`, as for the
ORM reader. Opening follows storage/readonly.py: a user who cannot write the file or its directory
reads a WAL database ``mode=ro`` while a writer is connected, else ``immutable=1``.
"""

from __future__ import annotations

import json
import os
import sqlite3
from collections.abc import Callable, Sequence
from datetime import date, datetime
from types import SimpleNamespace
from typing import Any
from urllib.parse import quote

from .jobmatch import ORDER, Cond, find

_json_loads: Callable[[str | bytes], Any]
try:
    from orjson import loads as _json_loads
except ImportError:  # pragma: no cover - orjson is a dependency; same values either way
    _json_loads = json.loads


def _json(v: Any) -> Any:
    return None if v is None else _json_loads(v)


def _datetime(v: Any) -> Any:
    return None if v is None else datetime.fromisoformat(v) if isinstance(v, str) else v


def _date(v: Any) -> Any:
    return None if v is None else date.fromisoformat(v[:10]) if isinstance(v, str) else v


def _bool(v: Any) -> Any:
    return None if v is None else bool(v)


_CONVERT: dict[str, Callable[[Any], Any]] = {"DATETIME": _datetime, "DATE": _date, "BOOLEAN": _bool, "JSON": _json}


def _q(name: str) -> str:
    """A quoted SQL identifier (``user`` is a keyword on PostgreSQL; quoted everywhere alike)."""
    return f'"{name}"'


def read_uri(path: str) -> tuple[str, bool]:
    """(sqlite3 URI, whether it is a read-only open) for a reader of the database file ``path``."""
    path = os.path.abspath(path)
    if os.access(path, os.W_OK) and os.access(os.path.dirname(path), os.W_OK):
        return f"file:{quote(path)}", False
    live = os.path.exists(path + "-wal") and os.path.exists(path + "-shm")
    return f"file:{quote(path)}?{'mode=ro' if live else 'immutable=1'}", True


class Reader:
    """An open database and its tables' column conversions. sqlite3.Error on any database problem."""

    def __init__(self, path: str) -> None:
        uri, _ro = read_uri(path)
        self.con = sqlite3.connect(uri, uri=True, timeout=30)
        self.convert = {t: self._columns(t) for t in ("job", "job_gpu")}

    def _columns(self, table: str) -> list[tuple[str, Callable[[Any], Any] | None]]:
        cols = [(r[1], _CONVERT.get(str(r[2]).upper())) for r in self.con.execute(f"PRAGMA table_info({_q(table)})")]
        if not cols:
            raise sqlite3.OperationalError(f"no such table: {table} (not a slurm-gpueff database?)")
        return cols

    def rows(self, table: str, where: str, params: Sequence[Any], order: Sequence[str]) -> list[SimpleNamespace]:
        cols = self.convert[table]
        sql = (f"SELECT {', '.join(_q(c) for c, _ in cols)} FROM {_q(table)} WHERE {where} "
               f"ORDER BY {', '.join(_q(c) for c in order)}")
        return [SimpleNamespace(**{c: (f(v) if f else v) for (c, f), v in zip(cols, row, strict=True)})
                for row in self.con.execute(sql, list(params))]

    def close(self) -> None:
        self.con.close()


def lookup(path: str, spec: Any, cluster: str | None = None) -> list[tuple[SimpleNamespace, list[SimpleNamespace]]]:
    """(job, its GPU rows by node and index) for every job ``spec`` names, as storage.queries would give."""
    db = Reader(path)
    try:
        def run(any_of: Sequence[Cond], all_of: Sequence[Cond]) -> list[SimpleNamespace]:
            conds = ["(" + " OR ".join(f"{_q(c)} = ?" for c, _ in any_of) + ")", *(f"{_q(c)} = ?" for c, _ in all_of)]
            params: list[Any] = [v for _, v in any_of] + [v for _, v in all_of]
            if cluster is not None:
                conds.append(f"{_q('cluster')} = ?")
                params.append(cluster)
            return db.rows("job", " AND ".join(conds), params, ORDER)

        jobs = find(spec, run)
        return [(j, db.rows("job_gpu", f"{_q('job_pk')} = ?", [j.id], ("node", "gpu_index"))) for j in jobs]
    finally:
        db.close()
