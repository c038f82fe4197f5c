"""The durable spool: where a finished job's record waits until the database has it.

Layout under ``paths.spool_dir``::

    incoming/    job-<job_id>-<node>.json   one per job and node; written atomically
    quarantine/  <name> + <name>.error      records ingest could not read, with the reason
    .tmp-*       half-written files (never read; cleaned up by ingest when old)

Writes are temp file + fsync + rename + directory fsync, mode 0600 in 0700 directories (records name
users and accounts). Stdlib only: the Epilog calls this on every job end.
"""

from __future__ import annotations

import json
import os
import re
import time

# Annotation-only imports: typing costs ~2 ms at start-up, which every Prolog/Epilog would pay.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator
    from typing import Any

INCOMING = "incoming"
QUARANTINE = "quarantine"
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def record_name(job_id: int, node: str) -> str:
    """The file name of a job's record on a node (node names are sanitised, never a path)."""
    return f"job-{int(job_id)}-{_SAFE.sub('_', node) or 'node'}.json"


def ensure_dirs(spool_dir: str) -> None:
    os.makedirs(spool_dir, mode=0o700, exist_ok=True)  # makedirs gives only the leaf its mode
    for sub in (INCOMING, QUARANTINE):
        os.makedirs(os.path.join(spool_dir, sub), mode=0o700, exist_ok=True)


def atomic_write(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part."""
    directory = os.path.dirname(path) or "."
    # Not tempfile.mkstemp: importing tempfile (shutil, random, bz2, lzma) costs ~3 ms on the hook path.
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:  # noqa: SIM105 - contextlib would be one more import on the hook path
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def write_record(spool_dir: str, record: dict[str, Any]) -> str:
    """Write one record into ``incoming/``; return its path."""
    ensure_dirs(spool_dir)
    path = os.path.join(spool_dir, INCOMING, record_name(record["job_id"], record["node"]))
    atomic_write(path, json.dumps(record, separators=(",", ":"), allow_nan=False).encode())
    return path


def pending(spool_dir: str) -> Iterator[str]:
    """Paths of records waiting in ``incoming/``, oldest first (temp files skipped)."""
    d = os.path.join(spool_dir, INCOMING)
    try:
        entries = [e for e in os.scandir(d) if e.is_file() and e.name.endswith(".json")
                   and not e.name.startswith(".")]
    except FileNotFoundError:
        return
    keyed = []
    for e in entries:
        try:
            keyed.append((e.stat().st_mtime, e.name, e.path))
        except FileNotFoundError:  # taken by a concurrent ingest/forwarder since the scandir
            continue
    keyed.sort()
    for _mtime, _name, path in keyed:
        yield path


def quarantine(spool_dir: str, path: str, error: str) -> str:
    """Move a bad record aside with a ``.error`` file beside it; never delete it."""
    ensure_dirs(spool_dir)
    qdir = os.path.join(spool_dir, QUARANTINE)
    base = os.path.basename(path)
    dest = os.path.join(qdir, base)
    if os.path.exists(dest):
        dest = os.path.join(qdir, f"{int(time.time())}-{base}")
    os.replace(path, dest)
    atomic_write(dest + ".error", (error.rstrip() + "\n").encode())
    return dest


def clean_stale_tmp(spool_dir: str, older_than_s: float = 3600.0) -> int:
    """Remove temp files left by a writer that died mid-write (the record was never complete)."""
    d = os.path.join(spool_dir, INCOMING)
    n = 0
    now = time.time()
    try:
        for e in os.scandir(d):
            if e.name.startswith(".tmp-") and now - e.stat().st_mtime > older_than_s:
                os.unlink(e.path)
                n += 1
    except FileNotFoundError:
        pass
    return n
