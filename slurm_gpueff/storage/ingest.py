"""Ingest: drain the spool into the database, losing nothing and duplicating nothing (docs/DESIGN.md
"Data flow", step 4).

Records go in batches of up to ``BATCH``, one transaction each (storage/writer.py). A batch's files are
removed only after its commit, which is durable when it returns: a crash before it keeps the files, one
after it at worst leaves files whose records are ingested again, which changes nothing (storage/merge.py).
An unavailable database (locked, down, disk full) stops the run and leaves the files for the next run;
any other error retries the batch one record per transaction, so that only a record the database
rejects is quarantined.

The spool trusts only what the nodes wrote (access/spool_trust.py); anything else is quarantined with the
reason, never read or followed.
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine

from .. import record as recmod
from .. import spool
from ..access.spool_trust import SpoolTrust, read_json, spool_trust
from ..errors import GpueffError, RecordError
from .db import first_line
from .writer import UNAVAILABLE, transaction, write_records

log = logging.getLogger(__name__)
K = TypeVar("K")

BATCH = 1000  # records per transaction: fewer round trips and commits, bounded memory
UNLINK_THREADS = 8
@dataclass
class IngestResult:
    """What one ingest run did. ``failed`` files stay in the spool for the next run."""

    ingested: int = 0
    quarantined: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    unavailable: bool = False  # the database was unavailable: the run stopped, its records wait in the spool


def read_record(path: str, trust: SpoolTrust | None = None) -> dict[str, Any]:
    """Parse and validate one spool file; RecordError says what is wrong with it, or why it is not trusted
    (with ``trust``: see the module docstring). FileNotFoundError if it is gone; other OSErrors pass."""
    return recmod.validate(read_json(path, trust))


def ingest_spool(engine: Engine, spool_dir: str, *, limit: int | None = None,
                 progress: Callable[[int, int], None] | None = None, batch: int = BATCH,
                 trust: SpoolTrust | None = None) -> IngestResult:
    """Drain ``spool_dir``'s incoming records into the database (at most ``limit`` files, oldest first),
    calling ``progress(done, total)`` after each batch; ``trust`` defaults to :func:`spool_trust`'s default.
    Never raises for a bad record or an unavailable database; GpueffError (one line) for a spool it cannot
    list."""
    trust = trust or spool_trust(spool_dir)
    try:
        if limit is None:  # every record: only a job's own records need ordering (spool.pending_by_job)
            paths = [p for group in spool.pending_by_job(spool_dir, stale_tmp_s=spool.STALE_TMP_S) for p in group]
        else:  # the oldest ``limit`` records, a job's records together as above
            oldest = list(spool.pending(spool_dir, stale_tmp_s=spool.STALE_TMP_S))[: max(0, limit)]
            paths = [p for group in spool.group_by_job(oldest) for p in group]
    except OSError as exc:  # a spool that is no folder (a FIFO, a file), or one closed to us: nothing read
        where = f" ({exc.filename})" if exc.filename and exc.filename != spool_dir else ""
        raise GpueffError(f"cannot read the spool {spool_dir}{where}: {exc.strerror or exc}") from None
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
            self.res.unavailable = True
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
