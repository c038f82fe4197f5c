"""Whether the job database is sound: a bounded check, and the mark a damaged SQLite file carries.

One damaged page is met only by the statements that read it: a command that reads other pages runs and
exits 0 on a file that is already losing jobs. So ``gpueff serve`` checks the whole file when it starts
and once a day (:func:`check`, bounded in time), and on damage leaves a mark beside the file
(``<file>-damaged``, as SQLite's own ``-wal``). Every command that opens the file meets the mark
(:func:`found`) and stops with one line, as it would on the damaged page itself. The mark names the file
as it was found (device, inode, size, modification time): a file restored from a backup, moved or copied
over it, is another, so the mark no longer applies, and the next check removes it. ``gpueff db check`` and
``gpueff doctor`` look past the mark, to check the file again.

Stdlib only at import time: seff-gpu's SQLite reader meets the mark without SQLAlchemy.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import tempfile
import time
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    from sqlalchemy.engine import Connection

MARK_SUFFIX = "-damaged"


class Damage(NamedTuple):
    """What the last check found in the file it marked: when (epoch seconds) and SQLite's first words."""

    found_at: float
    detail: str

    def message(self, path: str) -> str:
        when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(self.found_at))
        return (f"found by the integrity check at {when}: {self.detail[:300]}; restore {path} from a backup, "
                f"then `gpueff db check` (this stays until {path}{MARK_SUFFIX} is gone)")


def check(conn: Connection, limit_s: float) -> tuple[str, str]:
    """A quick integrity check: (``"ok"``, what was checked), (``"damaged"``, the first problems) or
    (``"unfinished"``, why). SQLite: ``PRAGMA quick_check`` (every page and record, not the indexes'
    contents), stopped after ``limit_s`` seconds; a server keeps its own pages: one row read from each table."""
    from sqlalchemy import text
    from sqlmodel import SQLModel

    if conn.dialect.name != "sqlite":
        for table in sorted(SQLModel.metadata.tables):
            conn.execute(text(f'SELECT 1 FROM "{table}" LIMIT 1')).all()
        return "ok", f"one row read from each of {len(SQLModel.metadata.tables)} tables"
    raw: Any = conn.connection.dbapi_connection
    deadline = time.monotonic() + limit_s
    raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        rows = [str(r[0]) for r in raw.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.OperationalError as exc:
        if "interrupt" in str(exc):
            return "unfinished", f"quick_check stopped after {limit_s:g} s (a large database: run it by hand)"
        raise
    except sqlite3.DatabaseError as exc:
        return "damaged", str(exc)
    finally:
        raw.set_progress_handler(None, 0)
    if rows == ["ok"]:
        return "ok", "quick_check ok"
    return "damaged", "; ".join(r.replace("\n", " ") for r in rows[:5])


def mark_of(path: str) -> str:
    return path + MARK_SUFFIX


def found(path: str) -> Damage | None:
    """The damage the last check found in this very file (not in one it was since restored over), else None."""
    try:
        with open(mark_of(path), encoding="utf-8") as fh:
            mark = json.load(fh)
        st = os.stat(path)
    except (OSError, ValueError):
        return None  # no mark, an unreadable one, or no file: the commands meet what is there themselves
    if not isinstance(mark, dict) or mark.get("file") != _identity(st):
        return None
    at, detail = mark.get("found_at"), mark.get("detail")
    return Damage(float(at) if isinstance(at, int | float) else 0.0, str(detail or "damaged"))


def _identity(st: os.stat_result) -> list[int]:
    return [st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns]


def record(path: str, state: str, detail: str) -> None:
    """Leave the mark on a damaged file (readable by whoever may read the file), or take it away after a
    check that passed; an unfinished check changes nothing."""
    if state == "ok":
        with contextlib.suppress(FileNotFoundError):
            os.unlink(mark_of(path))
        return
    if state != "damaged":
        return
    st = os.stat(path)
    body = json.dumps({"found_at": time.time(), "detail": detail, "file": _identity(st)})
    fd, tmp = tempfile.mkstemp(prefix=".damaged.", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body + "\n")
        os.chmod(tmp, st.st_mode & 0o644)
        os.replace(tmp, mark_of(path))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
