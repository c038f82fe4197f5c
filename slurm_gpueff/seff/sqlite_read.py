"""seff-gpu's path on SQLite: one job's rows with the standard library's sqlite3, no SQLAlchemy.

Importing SQLAlchemy, SQLModel and pydantic was most of ``seff-gpu JOBID``'s run time (docs/bench/README.md).
It makes the read model's rows (readmodel.py) from the values SQLAlchemy would give (tests/test_sqlite_read.py
compares them with storage.queries' over the same database): each column converted by its declared type
(``DATETIME`` -> naive UTC datetime as SQLAlchemy stores it, ``BOOLEAN`` -> bool, ``JSON`` -> decoded); a
column a database not yet upgraded lacks takes the model's default. Which rows a job id names comes from
:mod:`storage.jobmatch`, as for the ORM reader.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from orjson import loads as _json_loads

from ..readmodel import GpuRow, JobRow, Points, gpu_row, job_row
from ..storage.dburl import BUSY_S, read_uri
from ..storage.integrity import found
from ..storage.jobmatch import ORDER, Cond, find

# Declared column type of job and job_gpu -> the value SQLAlchemy gives for a stored one (NULL stays None).
_CONVERT: dict[str, Callable[[Any], Any]] = {"DATETIME": datetime.fromisoformat, "BOOLEAN": bool, "JSON": _json_loads}


def _q(name: str) -> str:
    """A quoted SQL identifier (``user`` is a keyword on PostgreSQL; quoted everywhere alike)."""
    return f'"{name}"'


def lookup(path: str, spec: Any, cluster: str | None = None,
           busy_s: float = BUSY_S) -> list[tuple[JobRow, list[GpuRow]]]:
    """(job, its GPU rows by node and index) for every job ``spec`` names, as storage.queries would give.
    sqlite3.Error on any database problem (one locked longer than ``busy_s``), and on a file the integrity
    check marked damaged."""
    damage = found(path)
    if damage is not None:
        raise sqlite3.DatabaseError(f"the database file is damaged ({damage.message(path)})")
    with contextlib.closing(sqlite3.connect(read_uri(path), uri=True, timeout=busy_s)) as con:
        columns = {t: _columns(con, t) for t in ("job", "job_gpu")}

        def rows(table: str, where: str, params: Sequence[Any], order: Sequence[str]) -> list[dict[str, Any]]:
            cols = columns[table]  # in the order of SELECT *
            sql = f"SELECT * FROM {_q(table)} WHERE {where} ORDER BY {', '.join(_q(c) for c in order)}"
            return [{c: f(v) if f and v is not None else v for (c, f), v in zip(cols, row, strict=True)}
                    for row in con.execute(sql, list(params))]

        def run(any_of: Sequence[Cond], all_of: Sequence[Cond]) -> list[JobRow]:
            conds = ["(" + " OR ".join(f"{_q(c)} = ?" for c, _ in any_of) + ")", *(f"{_q(c)} = ?" for c, _ in all_of)]
            params: list[Any] = [v for _, v in any_of] + [v for _, v in all_of]
            if cluster is not None:
                conds.append(f"{_q('cluster')} = ?")
                params.append(cluster)
            return [job_row(r) for r in rows("job", " AND ".join(conds), params, ORDER)]

        return [(j, [gpu_row(g) for g in rows("job_gpu", f"{_q('job_pk')} = ?", [j.id], ("node", "gpu_index"))])
                for j in find(spec, run)]


def _columns(con: sqlite3.Connection, table: str) -> list[tuple[str, Callable[[Any], Any] | None]]:
    """(name, conversion) of the table's columns, in order."""
    cols = [(r[1], _CONVERT.get(str(r[2]).upper())) for r in con.execute(f"PRAGMA table_info({_q(table)})")]
    if not cols:
        raise sqlite3.OperationalError(f"no such table: {table} (not a slurm-gpueff database?)")
    return cols


_CHUNK = 500  # ids per query: below SQLite's smallest limit of bound variables (999 before 3.32)


def timelines(path: str, gpu_ids: Sequence[int], busy_s: float = BUSY_S) -> dict[int, Points]:
    """Coarse timelines by ``job_gpu.id``, as storage.queries.gpu_timelines gives them (GPUs without one are
    absent: retention deletes them while the figures stay). sqlite3.Error on any database problem."""
    out: dict[int, Points] = {}
    ids = list(dict.fromkeys(gpu_ids))
    with contextlib.closing(sqlite3.connect(read_uri(path), uri=True, timeout=busy_s)) as con:
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i:i + _CHUNK]
            sql = (f"SELECT {_q('job_gpu_id')}, {_q('points')} FROM {_q('job_gpu_timeline')} "
                   f"WHERE {_q('job_gpu_id')} IN ({', '.join('?' * len(chunk))})")
            for gpu_id, points in con.execute(sql, chunk):
                out[gpu_id] = list(_json_loads(points) or []) if points is not None else []
    return out
