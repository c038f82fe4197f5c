"""Ingest: drain the spool into the database, losing nothing and duplicating nothing (docs/DESIGN.md
"Data flow", step 4).

Records go in batches of up to ``BATCH``, one transaction each (storage/writer.py). A batch's files are
removed only after its commit, which is durable when it returns: a crash before it keeps the files, one
after it at worst leaves files whose records are ingested again, which changes nothing (storage/merge.py).
An unavailable database (locked, down, disk full) stops the run and leaves the files for the next run;
any other error retries the batch one record per transaction, so that only a record the database
rejects is quarantined.

The spool trusts only what the nodes wrote (:class:`SpoolTrust`): a regular file, named like a record,
owned by root or the spool's owner, writable by its owner only, and not larger than the limit. It is opened
without following links and without waiting (a FIFO), and checked and read through that one descriptor,
so it cannot be swapped in between. Anything else is quarantined with the reason, never read or followed.
"""

from __future__ import annotations

import errno
import gc
import logging
import os
import pwd
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from .. import record as recmod
from .. import spool
from ..config import Config
from ..errors import ConfigError, RecordError
from .db import first_line
from .writer import UNAVAILABLE, transaction, write_records

log = logging.getLogger(__name__)
K = TypeVar("K")

BATCH = 1000  # records per transaction: fewer round trips and commits, bounded memory
UNLINK_THREADS = 8
MAX_FILE_MB = 64.0
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR:
          "a character device", stat.S_IFBLK: "a block device", stat.S_IFLNK: "a symbolic link"}


@dataclass(frozen=True)
class SpoolTrust:
    """Whose spool files ingest takes (root's always) and how large; built by :func:`spool_trust`."""

    owners: frozenset[int]
    max_bytes: int

    def problem(self, st: os.stat_result) -> str | None:
        """Why an entry with this ``lstat``/``fstat`` is not a record the nodes wrote; None if it may be."""
        kind = stat.S_IFMT(st.st_mode)
        if kind != stat.S_IFREG:
            return f"{_KINDS.get(kind, 'a special file')}, not a regular file: the spool takes records only"
        if st.st_uid not in self.owners:
            return (f"owned by {_user(st.st_uid)}; the spool takes records written by "
                    f"{' or '.join(_user(u) for u in sorted(self.owners))} only")
        if st.st_mode & 0o022:
            return (f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}): anyone might have written "
                    "it; records are written 0600")
        if st.st_size > self.max_bytes:
            return f"{st.st_size} bytes, over the limit of {self.max_bytes} ([spool] max_file_mb)"
        return None


def spool_trust(spool_dir: str, owner: str = "", max_file_mb: float = MAX_FILE_MB) -> SpoolTrust:
    """The trust of ``[spool]``: root and ``owner`` (a user name or uid; "" = the owner of ``incoming/``)."""
    owners = {0}
    if owner:
        if owner.isascii() and owner.isdigit():
            owners.add(int(owner))
        else:
            try:
                owners.add(pwd.getpwnam(owner).pw_uid)
            except KeyError:
                raise ConfigError(f"spool.owner = {owner!r}: no such user") from None
    else:
        for d in (os.path.join(spool_dir, spool.INCOMING), spool_dir):
            try:
                owners.add(os.stat(d).st_uid)
                break
            except OSError:
                continue
        else:
            owners.add(os.getuid())
    return SpoolTrust(frozenset(owners), int(max_file_mb * 1024 * 1024))


def configured_trust(config: Config) -> SpoolTrust:
    return spool_trust(config.paths.spool_dir, config.spool.owner, config.spool.max_file_mb)


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


@dataclass
class IngestResult:
    """What one ingest run did. ``failed`` files stay in the spool for the next run."""

    ingested: int = 0
    quarantined: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


def read_record(path: str, trust: SpoolTrust | None = None) -> dict[str, Any]:
    """Parse and validate one spool file; RecordError says what is wrong with it, or why it is not trusted
    (with ``trust``: see the module docstring). FileNotFoundError if it is gone; other OSErrors pass."""
    return recmod.validate(read_json(path, trust))


def read_json(path: str, trust: SpoolTrust | None = None) -> Any:
    """One spool file's JSON, not yet validated (the forwarder leaves that to the service, which trusts no
    node); RecordError if it is not trusted or not JSON."""
    if trust is not None:
        name = os.path.basename(path)
        if not spool.RECORD_NAME.fullmatch(name):
            raise RecordError("not named like a record (job-<id>-...json): the spool takes records only")
        problem = trust.problem(os.lstat(path))  # before any open: a device or FIFO is never opened
        if problem:
            raise RecordError(problem)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # swapped for a link or a socket since the lstat
            raise RecordError(f"not a regular file ({exc.strerror}): the spool takes records only") from None
        raise
    with open(fd, "rb") as fh:
        if trust is not None:
            problem = trust.problem(os.fstat(fd))  # the file read is the file checked
            if problem:
                raise RecordError(problem)
        data = fh.read()
    if not data.strip():
        raise RecordError("empty file")
    try:
        rec = orjson.loads(data)
    except ValueError as exc:  # JSONDecodeError (orjson's too) and UnicodeDecodeError
        raise RecordError(f"not valid JSON: {exc}") from None
    return rec


def ingest_spool(engine: Engine, spool_dir: str, *, limit: int | None = None,
                 progress: Callable[[int, int], None] | None = None, batch: int = BATCH,
                 trust: SpoolTrust | None = None) -> IngestResult:
    """Drain ``spool_dir``'s incoming records into the database (at most ``limit`` files, oldest first),
    calling ``progress(done, total)`` after each batch; ``trust`` defaults to :func:`spool_trust`'s default.
    Never raises for a bad record or an unavailable database."""
    trust = trust or spool_trust(spool_dir)
    if limit is None:  # every record: only a job's own records need ordering (spool.pending_by_job)
        paths = [p for group in spool.pending_by_job(spool_dir, stale_tmp_s=spool.STALE_TMP_S) for p in group]
    else:  # the oldest ``limit`` records, a job's records together as above
        oldest = list(spool.pending(spool_dir, stale_tmp_s=spool.STALE_TMP_S))[: max(0, limit)]
        paths = [p for group in spool.group_by_job(oldest) for p in group]
    step, total, res = max(1, batch), len(paths), IngestResult()
    # The cyclic garbage collector would scan a batch's ~100 k small containers again and again while
    # it is parsed (docs/bench/); records are trees, which reference counting frees all the same.
    gc_was_on = gc.isenabled()
    gc.disable()
    # Committed files are removed in threads while the next batch is read: unlink(2) can wait
    # milliseconds on the file system's journal, and concurrent unlinks share that wait (docs/bench/).
    try:
        with ThreadPoolExecutor(UNLINK_THREADS) as pool:  # leaving it waits for every removal
            run = _Run(engine, spool_dir, pool, res, trust)
            for start in range(0, total, step):
                chunk = paths[start:start + step]
                if not run.batch(chunk, left_after=total - start - len(chunk)):
                    break
                if progress is not None:
                    progress(start + len(chunk), total)
    finally:
        if gc_was_on:
            gc.enable()
    return res


@dataclass
class _Run:
    """One ingest run: its database, spool, file-removal threads and result."""

    engine: Engine
    spool_dir: str
    pool: ThreadPoolExecutor
    res: IngestResult
    trust: SpoolTrust

    def batch(self, chunk: list[str], left_after: int) -> bool:
        """Read, validate and store one batch; False when the database is unavailable (stop the run)."""
        good: list[tuple[str, dict[str, Any]]] = []
        for path in chunk:
            try:
                good.append((path, read_record(path, self.trust)))
            except FileNotFoundError:
                continue  # taken by a concurrent ingest
            except RecordError as exc:
                self.quarantine(path, str(exc))
            except OSError as exc:  # unreadable right now (EIO, EACCES): not the record's fault
                self.res.failed += 1
                self.res.errors.append(f"{path}: cannot read: {exc}")
        try:
            self.store(good)
        except UNAVAILABLE as exc:
            left = len(good) + left_after
            self.res.failed += left
            msg = f"database unavailable ({first_line(exc)}); {left} record(s) left in the spool for the next run"
            self.res.errors.append(msg)
            log.error(msg)
            return False
        return True

    def store(self, good: list[tuple[str, dict[str, Any]]]) -> None:
        """Write the records, then remove the files of those stored and quarantine those rejected."""
        out = store_records(self.engine, good)
        self.res.ingested += len(out.stored)
        self.remove(out.stored)
        self.res.failed += len(out.left)
        self.res.errors.extend(out.errors)
        for path, why in out.rejected:
            self.quarantine(path, why)

    def remove(self, paths: list[str]) -> None:
        n = min(UNLINK_THREADS, -(-len(paths) // 16))  # threads of at least 16 files; none for none
        for i in range(n):
            self.pool.submit(_unlink, paths[i::n])

    def quarantine(self, path: str, error: str) -> None:
        try:
            dest = spool.quarantine(self.spool_dir, path, error)
        except FileNotFoundError:
            return
        except OSError as exc:
            self.res.failed += 1
            self.res.errors.append(f"{path}: {error}; and cannot quarantine it: {exc}")
            return
        self.res.quarantined += 1
        # Said once, by whoever runs the ingest with its errors (the service's ingest task logs them, the
        # command prints them): a log line here as well made every quarantined record two.
        self.res.errors.append(f"{os.path.basename(path)}: {error} (quarantined as {dest})")


@dataclass
class Stored(Generic[K]):
    """What :func:`store_records` did with each record, by the caller's key (a spool path, a pushed name)."""

    stored: list[K] = field(default_factory=list)
    rejected: list[tuple[K, str]] = field(default_factory=list)  # the database refuses it: quarantine it
    left: list[K] = field(default_factory=list)  # not stored this time, not the record's fault: try again
    errors: list[str] = field(default_factory=list)


def store_records(engine: Engine, items: list[tuple[K, dict[str, Any]]]) -> Stored[K]:
    """Write validated records in one transaction; on an error that is not the database's, find the records
    at fault one per transaction. Raises UNAVAILABLE (database locked, down, full): then nothing is known to
    be stored, and everything may be sent again, which changes nothing (storage/merge.py)."""
    if not items:
        return Stored()
    try:
        _write(engine, [rec for _key, rec in items])
    except UNAVAILABLE:
        raise
    except Exception as exc:  # noqa: BLE001 - some record in the batch: find it
        log.warning("batch of %d records failed (%s); retrying one by one", len(items), exc)
        return _one_by_one(engine, items)
    return Stored(stored=[key for key, _rec in items])


def _write(engine: Engine, recs: list[dict[str, Any]]) -> None:
    with transaction(engine) as conn:
        write_records(conn, recs)


def _one_by_one(engine: Engine, items: list[tuple[K, dict[str, Any]]]) -> Stored[K]:
    """Each record in its own transaction; those the database rejects are ``rejected``, unless it rejects
    all of them: validated records point then at the software or the schema, and are ``left``."""
    out: Stored[K] = Stored()
    rejected: list[tuple[K, Exception]] = []
    for key, rec in items:
        try:
            _write(engine, [rec])
        except UNAVAILABLE:
            raise
        except sa_exc.IntegrityError as exc:  # another writer inserted the same job meanwhile: next run
            out.left.append(key)
            out.errors.append(f"{key}: conflict, left for the next run: {exc.orig}")
        except Exception as exc:  # noqa: BLE001 - judged below
            rejected.append((key, exc))
        else:
            out.stored.append(key)
    if rejected and not out.stored:
        first = rejected[0][1]
        msg = (f"the database rejected all {len(rejected)} record(s) of a batch ({type(first).__name__}: "
               f"{first}); left for the next run: this looks like a software or schema problem")
        out.left.extend(key for key, _exc in rejected)
        out.errors.append(msg)
        log.error(msg)
        return out
    out.rejected = [(key, f"database rejected the record: {type(exc).__name__}: {exc}") for key, exc in rejected]
    return out


def _unlink(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # a concurrent ingest took it
        except OSError as exc:  # the record is committed: a leftover file is only re-ingested next run
            log.warning("cannot remove ingested record %s: %s", path, exc)
