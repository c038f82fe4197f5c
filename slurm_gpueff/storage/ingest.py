"""Ingest: drain the spool into the database, losing nothing and duplicating nothing.

For each record in ``<spool>/incoming/`` (a job's records in the order they arrived):

* unreadable or invalid (empty file, bad JSON, wrong schema, impossible values: :func:`record.validate`)
  -> :func:`spool.quarantine` with an ``.error`` file naming the problem; ingest goes on;
* valid -> :func:`ingest_record` upserts the job (natural key cluster, job_id) and that node's GPUs
  (job, node, gpu_index) with their timelines, in a transaction shared by up to ``BATCH`` records;
  the files are unlinked only **after** the commit, and on SQLite only once it is durable
  (:class:`_Unlinker`).

Crash safety: a crash before the commit loses the transaction and keeps the files; a crash between the
commit and the unlinks re-ingests the same records on the next run, which is harmless because
:func:`ingest_record` is idempotent: rows are updated in place (same primary keys), every job-level
merge is order-independent (min start, max end, max exit code, union of nodes and reasons) and
``ingested_at`` is set once.

Database trouble (locked, down, disk full: ``OperationalError`` and friends) stops the run with the
files left in place and counted as ``failed``; the next run takes them. Any other error inside a batch
rolls it back and retries its records one per transaction, so one bad record is quarantined alone and
never poisons the others.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any, Protocol

from sqlalchemy import bindparam, delete, insert, update
from sqlalchemy import exc as sa_exc
from sqlalchemy import types as sqltypes
from sqlalchemy.engine import Connection, Engine
from sqlmodel import Session, select

from .. import record as recmod
from .. import spool
from ..errors import RecordError
from ..models import Job, JobGpu, JobGpuTimeline
from .db import json_loads as _loads  # orjson where installed: parsing is ingest's largest per-record cost
from .rollups import moved_month, note_moved

log = logging.getLogger(__name__)

BATCH = 1000  # records per transaction: fewer round trips, bounded memory
PARALLEL_MIN = 500  # files below which worker processes cost more to start than they save
UNLINK_THREADS = 8  # unlink(2) of fsync'd files waits on the file system journal: overlap them
# The database is unavailable (not the record's fault): stop, keep the files, try again next run.
UNAVAILABLE = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DisconnectionError, sa_exc.TimeoutError)
# Which backend label a multi-node job gets: the most capable one that measured any of its GPUs.
_BACKEND_RANK = {"none": 0, "simulated": 1, "nvml": 2, "nvml-gpm": 3, "dcgm": 4}


@dataclass
class IngestResult:
    """What one ingest run did. ``failed`` files stay in the spool for the next run."""

    ingested: int = 0
    quarantined: int = 0
    failed: int = 0
    errors: list[str] = field(default_factory=list)


class Sink(Protocol):
    """Where committed files go to be removed (:class:`_Unlinker`; in a parallel worker, a list)."""

    def submit(self, paths: list[str]) -> None: ...


class Turn(Protocol):
    """How a parallel worker writes a batch when writers must take turns (SQLite)."""

    def write(self, engine: Engine, recs: list[dict[str, Any]]) -> None: ...


class _Unavailable(Exception):
    """The database could not be written; carries the original error."""


def read_record(path: str) -> dict[str, Any]:
    """Parse and validate one spool file; RecordError says what is wrong with it."""
    with open(path, "rb") as fh:
        data = fh.read()
    if not data.strip():
        raise RecordError("empty file")
    try:
        rec = _loads(data)
    except ValueError as exc:  # JSONDecodeError (orjson's too) and UnicodeDecodeError
        raise RecordError(f"not valid JSON: {exc}") from None
    return recmod.validate(rec)


@contextlib.contextmanager
def no_cyclic_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch of parsed records is alive.

    A batch holds ~100 k small containers; with the collector on, each parse re-scans them and parsing
    took ~3x longer (measured: 85 vs 30 us/record). Records are trees, never cycles: reference counting
    frees them all the same. The previous state is restored, so a caller that disabled it keeps that.
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def worker_count(setting: int, dialect: str) -> int:
    """``[service] ingest_workers`` for a database of ``dialect``; 0 means automatic (one on a single CPU):

    * SQLite: half the CPUs, at least 2 and at most 8. One writer at a time sets the pace, and more
      workers only take CPU from it (16 CPUs, 20,000 records, alternating runs: 17.3k records/s with 8
      workers, 16.4k with 12);
    * PostgreSQL: three quarters of the CPUs, 2 to 12. Workers write at the same time; the rest of the
      host serves the file removal and, often, the server itself (same runs: 14.5k with 8, 19.2k with 12).

    On 2 CPUs, 2 workers ingest ~1.7x faster than one (docs/bench/).
    """
    if setting > 0:
        return setting
    cpus = os.cpu_count() or 1
    if cpus < 2:
        return 1
    return max(2, min(8, cpus // 2)) if dialect == "sqlite" else max(2, min(12, cpus * 3 // 4))


def _shareable(engine: Engine) -> bool:
    """Whether other processes can open the same database (not an in-memory SQLite one)."""
    return engine.dialect.name != "sqlite" or engine.url.database not in (None, "", ":memory:")


def ingest_spool(engine: Engine, spool_dir: str, *, limit: int | None = None,
                 progress: Callable[[int, int], None] | None = None, batch: int = BATCH,
                 workers: int = 1) -> IngestResult:
    """Drain ``spool_dir``'s incoming records into the database (at most ``limit`` files).

    ``progress(done, total)`` is called after each batch of ``batch`` records (one transaction each).
    With ``workers`` > 1 and a backlog of at least ``PARALLEL_MIN`` files, that many processes share the
    work (:mod:`slurm_gpueff.storage.ingest_parallel`); the outcome is the same as with one.
    Never raises for a bad record or an unavailable database; see :class:`IngestResult`.
    """
    step = max(1, batch)
    res = IngestResult()
    if limit is None:  # every record: only a job's own records need ordering (spool.pending_by_job)
        jobs = spool.pending_by_job(spool_dir, stale_tmp_s=spool.STALE_TMP_S)
    else:  # the oldest ``limit`` records
        jobs = spool.group_by_job(list(spool.pending(spool_dir, stale_tmp_s=spool.STALE_TMP_S))[: max(0, limit)])
    total = sum(map(len, jobs))
    with _Unlinker(wal_file(engine)) as unlinker:
        if workers > 1 and total >= PARALLEL_MIN and _shareable(engine):
            from .ingest_parallel import drain_parallel

            drain_parallel(engine, spool_dir, jobs, step, res, unlinker, progress, workers)
        else:
            _drain(engine, spool_dir, [p for group in jobs for p in group], step, res, unlinker, progress)
    return res


def _drain(engine: Engine, spool_dir: str, paths: list[str], step: int, res: IngestResult, unlinker: _Unlinker,
           progress: Callable[[int, int], None] | None) -> None:
    total = len(paths)
    # Files are read in this thread: a read-ahead thread measured no faster (it waits for the GIL that
    # parsing holds, and slows parsing down in turn); only the unlinks, pure system calls, overlap.
    for start in range(0, total, step):
        chunk = paths[start:start + step]
        with no_cyclic_gc():
            if not drain_batch(engine, spool_dir, chunk, res, unlinker, left_after=total - (start + len(chunk))):
                return
        if progress is not None:
            progress(min(start + len(chunk), total), total)


def drain_batch(engine: Engine, spool_dir: str, chunk: list[str], res: IngestResult, unlinker: Sink,
                left_after: int, turn: Turn | None = None) -> bool:
    """Read, validate and write one batch; False when the database is unavailable (stop the run).

    Committed files go to ``unlinker.submit``; ``turn``: see :func:`_write_batch`.
    """
    good: list[tuple[str, dict[str, Any]]] = []
    for path in chunk:
        try:
            good.append((path, read_record(path)))
        except FileNotFoundError:
            continue  # taken by a concurrent ingest
        except RecordError as exc:
            _quarantine(spool_dir, path, str(exc), res)
        except OSError as exc:  # unreadable right now (EIO, EACCES): not the record's fault
            res.failed += 1
            res.errors.append(f"{path}: cannot read: {exc}")
    try:
        _ingest_batch(engine, spool_dir, good, res, unlinker, turn)
    except _Unavailable as exc:
        left = len(good) + left_after
        res.failed += left
        msg = (f"database unavailable ({exc.__cause__}); {left} record(s) left in the spool "
               "for the next run")
        res.errors.append(msg)
        log.error(msg)
        return False
    return True


def _write_batch(engine: Engine, recs: list[dict[str, Any]], turn: Turn | None = None) -> None:
    """Write records in one transaction, or let ``turn`` write them (parallel ingest into SQLite, whose
    writers take turns: :class:`slurm_gpueff.storage.ingest_parallel.SqliteTurn`)."""
    if turn is not None:
        turn.write(engine, recs)
        return
    with engine.begin() as conn:
        write_records(conn, recs)


def _ingest_batch(engine: Engine, spool_dir: str, good: list[tuple[str, dict[str, Any]]],
                  res: IngestResult, unlinker: Sink, turn: Turn | None = None) -> None:
    if not good:
        return
    try:
        _write_batch(engine, [rec for _path, rec in good], turn)
    except UNAVAILABLE as exc:
        raise _Unavailable() from exc
    except Exception as exc:  # noqa: BLE001 - some record in the batch: find it, one per transaction
        log.warning("batch of %d records failed (%s); retrying one by one", len(good), exc)
        _one_by_one(engine, spool_dir, good, res, unlinker, turn)
        return
    paths = [path for path, _rec in good]
    res.ingested += len(paths)
    unlinker.submit(paths)


def wal_file(engine: Engine) -> str | None:
    """The write-ahead log whose fsync makes an SQLite file database's commits durable; None where a
    commit is durable by itself (PostgreSQL, in-memory SQLite)."""
    if engine.dialect.name != "sqlite" or not _shareable(engine):
        return None
    return os.path.abspath(str(engine.url.database)) + "-wal"


class _Unlinker:
    """Removes committed records' files in background threads while the next batch is parsed and written.

    unlink(2) of fsync'd files waits on the file system journal (~60 us each), so overlapping it with the
    CPU-bound parsing of the next batch hides most of it. Leaving the ``with`` block waits for every unlink:
    :func:`ingest_spool` returns with the committed files gone, as before. A crash in between only leaves
    committed files behind, which the next run re-ingests harmlessly (module doc).

    A file goes only once its record's commit is **durable**. SQLite runs in WAL mode with
    ``synchronous=NORMAL`` (db.py): a commit is safe from a crash of the process but not from a power cut
    or a kernel crash until the WAL is fsync'd, and the file's removal may reach the disk first. So with
    ``wal`` (:func:`wal_file`) the files of a commit are removed after an fsync of the WAL that began after
    that commit; one fsync covers every commit before it, so concurrent batches share one. A failed fsync
    keeps the files: their records are re-ingested next run, harmlessly.
    """

    def __init__(self, wal: str | None = None) -> None:
        self.pool = ThreadPoolExecutor(max_workers=UNLINK_THREADS)
        self.wal = wal
        self._sync_lock = threading.Lock()
        self._commits = 0  # commits handed in so far (submit runs in one thread: the ingest loop)
        self._durable_upto = 0  # the commits an fsync that began after them has made durable

    def submit(self, paths: list[str]) -> None:
        if not paths:
            return
        self._commits += 1
        n = max(1, min(UNLINK_THREADS, len(paths) // 16))
        for i in range(n):
            self.pool.submit(self._remove, paths[i::n], self._commits)

    def _remove(self, paths: list[str], commit: int) -> None:
        if self.wal is None or self._durable(commit):
            _unlink_many(paths)

    def _durable(self, commit: int) -> bool:
        with self._sync_lock:  # threads of later commits wait here and usually find them covered
            if self._durable_upto >= commit:
                return True
            upto = self._commits  # all handed in before the fsync begins
            try:
                fd = os.open(self.wal, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:  # no WAL: rollback-journal mode (durable at commit), or the last
                pass  # connection checkpointed it into the database, synced it, and removed the WAL
            else:
                try:
                    os.fsync(fd)
                except OSError as exc:
                    log.warning("cannot fsync %s (%s): ingested records' files are kept and re-ingested "
                                "next run", self.wal, exc)
                    return False
                finally:
                    os.close(fd)
            self._durable_upto = max(self._durable_upto, upto)
            return True

    def __enter__(self) -> _Unlinker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.pool.shutdown(wait=True)


def _unlink_many(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass  # a concurrent ingest took it
        except OSError as exc:  # the record is committed: a leftover file is only re-ingested next run
            log.warning("cannot remove ingested record %s: %s", path, exc)


def _one_by_one(engine: Engine, spool_dir: str, good: list[tuple[str, dict[str, Any]]],
                res: IngestResult, unlinker: Sink, turn: Turn | None = None) -> None:
    """Retry a failed batch record by record and quarantine the records the database rejects.

    Records were validated before: a database that rejects all of them points at the software or the
    schema, not at the records, so then nothing is quarantined: the files stay for the next run.
    """
    rejected: list[tuple[str, Exception]] = []
    stored: list[str] = []
    for path, rec in good:
        try:
            _write_batch(engine, [rec], turn)
        except UNAVAILABLE as exc:
            raise _Unavailable() from exc
        except sa_exc.IntegrityError as exc:  # a concurrent ingest inserted the same job: next run
            res.failed += 1
            res.errors.append(f"{path}: conflict, left for the next run: {exc.orig}")
            continue
        except Exception as exc:  # noqa: BLE001 - judged below
            rejected.append((path, exc))
            continue
        stored.append(path)
    res.ingested += len(stored)
    unlinker.submit(stored)
    if rejected and not stored:
        res.failed += len(rejected)
        first = rejected[0][1]
        msg = (f"the database rejected all {len(rejected)} record(s) of a batch ({type(first).__name__}: "
               f"{first}); left in the spool: this looks like a software or schema problem")
        res.errors.append(msg)
        log.error(msg)
        return
    for path, exc in rejected:
        _quarantine(spool_dir, path, f"database rejected the record: {type(exc).__name__}: {exc}", res)


def _quarantine(spool_dir: str, path: str, error: str, res: IngestResult) -> None:
    try:
        dest = spool.quarantine(spool_dir, path, error)
    except FileNotFoundError:
        return
    except OSError as exc:
        res.failed += 1
        res.errors.append(f"{path}: {error}; and cannot quarantine it: {exc}")
        return
    res.quarantined += 1
    res.errors.append(f"{os.path.basename(path)}: {error} (quarantined as {dest})")
    log.warning("quarantined %s: %s", path, error)


# --------------------------------------------------------------------------------------------------
def _utc(epoch: float | None) -> datetime | None:
    """Epoch seconds -> naive UTC datetime (how models.py stores every time)."""
    if epoch is None:
        return None
    return datetime.fromtimestamp(float(epoch), UTC).replace(tzinfo=None)


def _cut(value: Any, n: int) -> Any:
    return value[:n] if isinstance(value, str) else value


def _merge(values: list[Any], pick: Callable[..., Any]) -> Any:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def _state(exit_code: int | None, signal: int | None) -> str | None:
    """COMPLETED / FAILED from the hook's view; None when signalled (sacct enrichment knows better)."""
    if exit_code is None:
        return None
    if exit_code == 0 and not signal:
        return "COMPLETED"
    if exit_code != 0:
        return "FAILED"
    return None


# Per-GPU record fields copied as they are; the optional DCGM / MIG ones only where job_gpu has a column.
_GPU_FIELDS = ("minor", "memory_total_bytes", *recmod.FRACTIONS, "energy_j", "power_mean_w",
               *(f for f in recmod.OPTIONAL_GPU if f in JobGpu.__table__.c))
_IDENTITY = (("array_job_id", None), ("array_task_id", None), ("het_job_id", None), ("het_job_offset", None),
             ("user", 128), ("uid", None), ("account", 128), ("partition", 128))
_JOB_COLS = tuple(c.name for c in Job.__table__.columns)
_GPU_COLS = tuple(c.name for c in JobGpu.__table__.columns)
IN_CHUNK = 500  # bound parameters per IN (...) query: well under SQLite's and PostgreSQL's limits


def ingest_record(session: Session, rec: dict[str, Any]) -> Job:
    """Upsert one (validated) node record; idempotent and independent of the order nodes arrive in.

    Same code as the batch path (:func:`write_records`), run on the session's connection.
    """
    recmod.validate(rec)
    write_records(session.connection(), [rec])
    session.expire_all()  # rows changed underneath the ORM
    cluster = _cut(rec["cluster"], 64)
    return session.exec(select(Job).where(Job.cluster == cluster, Job.job_id == rec["job_id"])).one()


def plan_gpu_rows(gpus: dict[Any, dict[Any, dict[str, Any]]], jobs: dict[Any, dict[str, Any]],
                   touched: set[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], set[int]]:
    """Split the merged GPU rows into new rows, rows to update (nodes this batch touched), and kept ids."""
    final_ids: set[int] = set()
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for key, rows_ in gpus.items():
        for row in rows_.values():
            row["job_pk"] = jobs[key]["id"]
            if row.get("id") is None:
                inserts.append(row)
            else:
                final_ids.add(row["id"])
                if (key, row["node"]) in touched:
                    updates.append(row)
    return inserts, updates, final_ids


def _timeline_rows(gpus: dict[Any, dict[Any, dict[str, Any]]],
                   timelines: dict[Any, dict[int, list]]) -> list[dict[str, Any]]:
    """Timeline rows for the GPU rows written in this batch (their ids are known by now)."""
    rows = []
    for key, rows_ in gpus.items():
        for (node, idx), row in rows_.items():
            points = timelines.get((key, node), {}).get(idx)
            if points:
                rows.append({"job_gpu_id": row["id"], "points": points})
    return rows


def write_records(conn: Connection, recs: list[dict[str, Any]]) -> None:
    """Upsert validated node records in a few set-based statements (the fast path of ingest).

    Why not the ORM: at 1 M job-GPU rows a month the per-object overhead of the ORM (~2 ms/record)
    made ingest the bottleneck. Here a batch costs one SELECT for its jobs, one for their GPU rows,
    and one executemany per kind of change. The merge itself is the same pure-Python fold as before,
    applied record by record in spool order, so a batch ends exactly where sequential ingest would.
    """
    if recs:
        apply_plan(conn, plan_records(conn, recs))


@dataclass
class Plan:
    """What a batch will write: the merged rows, and the database state the merge started from.

    Built by :func:`plan_records` (reads only), written by :func:`apply_plan`. Parallel SQLite ingest
    plans outside the write lock and applies under it, after :meth:`current` has checked that the
    rows the merge read are still the rows in the database (otherwise it plans again); see
    :class:`slurm_gpueff.storage.ingest_parallel.SqliteTurn`.
    """

    keys: set[tuple[str, int]]
    jobs: dict[tuple[str, int], dict[str, Any]]
    old_jobs: dict[tuple[str, int], dict[str, Any]]
    old_gpus: dict[tuple[str, int], dict[tuple[str, int], dict[str, Any]]]
    gpus: dict[tuple[str, int], dict[tuple[str, int], dict[str, Any]]]
    touched: set[tuple[tuple[str, int], str]]
    timelines: dict[tuple[tuple[str, int], str], dict[int, Any]]
    tables: tuple[RawTable, RawTable, RawTable] | None = None  # raw dialects: set by _prebuild

    def current(self, conn: Connection) -> bool:
        """Whether the database still holds exactly the rows this plan was merged from."""
        jobs, gpus = _read_state(conn, self.keys)
        return jobs == self.old_jobs and gpus == self.old_gpus


def _read_state(conn: Connection, keys: set[tuple[str, int]]) -> tuple[dict, dict]:
    """The stored job rows of ``keys`` and their GPU rows ((job key) -> {(node, index): row})."""
    jt, gt = Job.__table__, JobGpu.__table__
    jobs: dict[tuple[str, int], dict[str, Any]] = {}
    ids = sorted({k[1] for k in keys})
    for i in range(0, len(ids), IN_CHUNK):
        for row in conn.execute(select(jt).where(jt.c.job_id.in_(ids[i:i + IN_CHUNK]))).mappings():
            if (row["cluster"], row["job_id"]) in keys:
                jobs[(row["cluster"], row["job_id"])] = dict(row)
    gpus: dict[tuple[str, int], dict[tuple[str, int], dict[str, Any]]] = {k: {} for k in jobs}
    by_pk = {v["id"]: k for k, v in jobs.items()}
    pks = sorted(by_pk)
    for i in range(0, len(pks), IN_CHUNK):
        stmt = select(gt).where(gt.c.job_pk.in_(pks[i:i + IN_CHUNK])).order_by(gt.c.id)
        for row in conn.execute(stmt).mappings():
            gpus[by_pk[row["job_pk"]]][(row["node"], row["gpu_index"])] = dict(row)
    return jobs, gpus


def plan_records(conn: Connection, recs: list[dict[str, Any]]) -> Plan:
    """Read the batch's stored rows and fold the records into them (no writes).

    On the raw dialects the parameters of every new row are built here too (``_params``), so that a
    writer taking turns (parallel SQLite ingest) spends less of its turn in Python.
    """
    keys = {(_cut(r["cluster"], 64), r["job_id"]) for r in recs}
    jobs, old_gpus = _read_state(conn, keys)
    old_jobs = {k: dict(v) for k, v in jobs.items()}
    # The fold edits GPU rows in place: it works on copies, the plan keeps what was read.
    gpus = {k: {nk: dict(r) for nk, r in old_gpus.get(k, {}).items()} for k in keys}
    touched: set[tuple[tuple[str, int], str]] = set()  # (job key, node) whose GPU rows records replaced
    timelines: dict[tuple[tuple[str, int], str], dict[int, Any]] = {}  # (job key, node) -> index -> points
    now = datetime.now(UTC).replace(tzinfo=None)
    for rec in recs:
        key = (_cut(rec["cluster"], 64), rec["job_id"])
        job = jobs.get(key)
        if job is None:
            job = jobs[key] = _new_job(key)
        node = _cut(rec["node"], 128)
        _fold(job, gpus[key], rec, node, now)
        touched.add((key, node))
        timelines[(key, node)] = {g["index"]: g.get("timeline") or [] for g in rec["gpus"]}
    plan = Plan(keys, jobs, old_jobs, old_gpus, gpus, touched, timelines)
    if conn.dialect.name in _RAW_DIALECTS:
        _prebuild(conn, plan)
    return plan


def apply_plan(conn: Connection, plan: Plan) -> None:
    """Write a plan in ``conn``'s transaction (which must see the state the plan was made from)."""
    jt, gt, tt = Job.__table__, JobGpu.__table__, JobGpuTimeline.__table__
    jobs, old_jobs, gpus, touched, timelines = plan.jobs, plan.old_jobs, plan.gpus, plan.touched, plan.timelines
    old_gpu_ids = {r["id"] for g in plan.old_gpus.values() for r in g.values()}
    moved = [old["end_time"] for k, old in old_jobs.items() if moved_month(old["end_time"], jobs[k]["end_time"])]
    if moved:  # a later node record moved the job's end into another month: its old month's rollups
        note_moved(conn, moved)  # are recomputed by the next refresh (storage/rollups.py)
    if conn.dialect.name in _RAW_DIALECTS:
        with raw_errors(conn):
            _write_raw(conn, plan, old_gpu_ids)
        return
    # --- write (other dialects, through SQLAlchemy Core): jobs first (GPU rows need their ids)
    new_keys = [k for k in jobs if k not in old_jobs]
    if new_keys:
        rows = [{c: v for c, v in jobs[k].items() if c != "id"} for k in new_keys]
        res = conn.execute(insert(jt).returning(jt.c.id, sort_by_parameter_order=True), rows)
        for k, (pk,) in zip(new_keys, res.all(), strict=True):
            jobs[k]["id"] = pk
    changed = [jobs[k] for k in old_jobs if jobs[k] != old_jobs[k]]
    if changed:
        cols = [c.name for c in jt.columns if c.name != "id"]
        stmt = update(jt).where(jt.c.id == bindparam("_id")).values({c: bindparam(c) for c in cols})
        conn.execute(stmt, [{"_id": j["id"], **{c: j[c] for c in cols}} for j in changed])
    # --- GPU rows
    inserts, updates, final_ids = plan_gpu_rows(gpus, jobs, touched)
    gone = sorted(old_gpu_ids - final_ids)
    for i in range(0, len(gone), IN_CHUNK):  # timelines first: no reliance on FK cascades
        conn.execute(delete(tt).where(tt.c.job_gpu_id.in_(gone[i:i + IN_CHUNK])))
        conn.execute(delete(gt).where(gt.c.id.in_(gone[i:i + IN_CHUNK])))
    cols = [c.name for c in gt.columns if c.name != "id"]
    if updates:
        stmt = update(gt).where(gt.c.id == bindparam("_id")).values({c: bindparam(c) for c in cols})
        conn.execute(stmt, [{"_id": r["id"], **{c: r[c] for c in cols}} for r in updates])
        upd = sorted(r["id"] for r in updates)
        for i in range(0, len(upd), IN_CHUNK):
            conn.execute(delete(tt).where(tt.c.job_gpu_id.in_(upd[i:i + IN_CHUNK])))
    if inserts:
        res = conn.execute(insert(gt).returning(gt.c.id, sort_by_parameter_order=True),
                           [{c: r.get(c) for c in cols} for r in inserts])
        for r, (pk,) in zip(inserts, res.all(), strict=True):
            r["id"] = pk
    tl_rows = _timeline_rows(gpus, timelines)
    if tl_rows:
        conn.execute(insert(tt), tl_rows)


_RAW_DIALECTS = ("sqlite", "postgresql")


@contextlib.contextmanager
def raw_errors(conn: Connection) -> Iterator[None]:
    """Raise DBAPI errors of raw statements as SQLAlchemy would (OperationalError, IntegrityError, ...),
    so that callers tell an unavailable database from a rejected record the same way on every path."""
    dbapi_error = conn.dialect.loaded_dbapi.Error
    try:
        yield
    except dbapi_error as exc:
        raise sa_exc.DBAPIError.instance(None, None, exc, dbapi_error, dialect=conn.dialect,
                                         connection_invalidated=conn.dialect.is_disconnect(exc, None, None),
                                         ) from exc


def _write_raw(conn: Connection, plan: Plan, old_gpu_ids: set[int]) -> None:
    """The write half of :func:`write_records` on the DBAPI connection of ``conn``'s transaction.

    Why: SQLAlchemy Core spent ~70 % of ingest building parameters, and on SQLite ``INSERT .. RETURNING``
    with many rows ran one statement per row. Values go through the columns' own bind processors
    (:class:`RawTable`), so the stored rows are exactly what Core would store. New rows take their ids
    first (PostgreSQL: the table's sequence; SQLite: after the largest id, which is what SQLite itself
    would choose) and go in with ``COPY`` on PostgreSQL (several times faster than executemany) and
    ``executemany`` on SQLite, with the parameters :func:`_prebuild` made.
    """
    db = RawWriter(conn)
    jobs, old_jobs, gpus = plan.jobs, plan.old_jobs, plan.gpus
    jt, gt, tt = plan.tables
    new_keys = [k for k in jobs if k not in old_jobs]
    if new_keys:
        db.add(jt, [jobs[k] for k in new_keys])
    changed = [jobs[k] for k in old_jobs if jobs[k] != old_jobs[k]]
    if changed:
        db.update(jt, changed)
    inserts, updates, final_ids = plan_gpu_rows(gpus, jobs, plan.touched)
    gone = sorted(old_gpu_ids - final_ids)
    db.delete_in("job_gpu_timeline", "job_gpu_id", gone)  # timelines first: no reliance on FK cascades
    db.delete_in("job_gpu", "id", gone)
    if updates:
        db.update(gt, updates)
        db.delete_in("job_gpu_timeline", "job_gpu_id", sorted(r["id"] for r in updates))
    if inserts:
        db.add(gt, inserts, patch="job_pk")
    tl_params = timeline_params(plan)
    if tl_params:
        db.put(tt, tl_params)


def timeline_params(plan: Plan) -> list[list[Any]]:
    """Parameter lists (job_gpu_id, points JSON text from :func:`_prebuild`) of the plan's timelines;
    its GPU rows' ids must be known."""
    return [[r["job_gpu_id"], r["points"]] for r in _timeline_rows(plan.gpus, plan.timelines)]


def params_with_ids(t: RawTable, rows: list[dict[str, Any]], ids: Iterable[int],
                    patch: str | None = None) -> list[list[Any]]:
    """Give each new row its ``id`` and return its parameter list (``t``'s columns, then the id).

    The list is the one :func:`_prebuild` made where there is one; ``patch`` names a foreign key
    (``job_pk``) that was unknown then and is filled in from the row now.
    """
    at = t.cols.index(patch) if patch else -1
    params = []
    for row, pk in zip(rows, ids, strict=True):
        row["id"] = pk
        vals = row.pop("_params", None) or t.values(row)
        if at >= 0:
            vals[at] = row[patch]
        vals.append(pk)
        params.append(vals)
    return params


def _prebuild(conn: Connection, plan: Plan) -> None:
    """Build the parameters of the plan's new rows now, ids and foreign keys left to fill in at write time.

    Job and GPU rows get a ``_params`` list (``RawTable.values``); timeline points become their JSON text.
    """
    tables = plan.tables = (RawTable(Job.__table__, conn.dialect), RawTable(JobGpu.__table__, conn.dialect),
                            RawTable(JobGpuTimeline.__table__, conn.dialect))
    jt, gt, tt = tables
    for key, job in plan.jobs.items():
        if key not in plan.old_jobs:
            job["_params"] = jt.values(job)
        for row in plan.gpus[key].values():
            if row.get("id") is None:
                row["_params"] = gt.values(row)
    points = tt.procs[tt.cols.index("points")]
    assert points is not None  # a JSON column always has a bind processor (the engine's serializer)
    for by_index in plan.timelines.values():
        for idx, pts in by_index.items():
            if pts:
                by_index[idx] = points(pts)


class RawTable:
    """A table's columns (``id`` apart) with their dialect's bind processors, for raw DBAPI statements."""

    def __init__(self, table: Any, dialect: Any) -> None:
        self.name = table.name
        self.cols = [c.name for c in table.columns if c.name != "id"]
        self.procs = [_bind_processor(table.c[c].type, dialect) for c in self.cols]
        self.convert = [(i, p) for i, p in enumerate(self.procs) if p is not None]
        self._get = itemgetter(*self.cols) if len(self.cols) > 1 else (lambda row: (row[self.cols[0]],))

    def quoted(self, *extra: str) -> str:
        return ", ".join(f'"{c}"' for c in (*self.cols, *extra))

    def values(self, row: dict[str, Any]) -> list[Any]:
        """The row as a parameter list: None goes through the processors too (JSON stores 'null')."""
        try:
            vals = list(self._get(row))  # rows built by the merge carry every column: one C call
        except KeyError:
            vals = [row.get(c) for c in self.cols]
        for i, proc in self.convert:
            vals[i] = proc(vals[i])
        return vals


def _bind_processor(col_type: Any, dialect: Any) -> Callable[[Any], Any] | None:
    """The column type's bind processor, made cheaper for ingest's value patterns; same output.

    * JSON: SQLAlchemy's processor only adds checks for its NULL sentinels (which merged rows never hold)
      around the engine's serializer; here the serializer is called directly, with the two values most
      rows hold (null, and ``{}`` for "nothing missing") answered from constants.
    * DateTime (SQLite formats it as text): a batch repeats few distinct times (a record's start and end
      are on the job and on every GPU row), so the formatted text is memoised per batch.
    """
    proc = col_type.dialect_impl(dialect).bind_processor(dialect)
    if isinstance(col_type, sqltypes.JSON):
        ser = dialect._json_serializer
        if col_type.none_as_null or ser is None or sqltypes.String().bind_processor(dialect) is not None:
            return proc
        null, empty = ser(None), ser({})

        def json_value(value: Any) -> Any:
            if value is None:
                return null
            if value.__class__ is dict and not value:
                return empty
            return ser(value)
        return json_value
    if proc is not None and isinstance(col_type, sqltypes.DateTime):
        memo: dict[Any, Any] = {}

        def datetime_value(value: Any) -> Any:
            try:
                return memo[value]
            except KeyError:
                out = memo[value] = proc(value)
                return out
        return datetime_value
    return proc


class RawWriter:
    """The DBAPI cursor of the SQLAlchemy connection's transaction (commit and rollback stay with it)."""

    def __init__(self, conn: Connection) -> None:
        self.dialect = conn.dialect
        self.pg = conn.dialect.name == "postgresql"
        self.ph = "%s" if self.pg else "?"
        self.cur = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]

    def marks(self, n: int) -> str:
        return ", ".join([self.ph] * n)

    def new_ids(self, table: str, n: int) -> list[int]:
        """``n`` ids for new rows: from the table's sequence on PostgreSQL (one round trip); on SQLite the
        ones after the largest id, which is what SQLite itself would assign (``INTEGER PRIMARY KEY``).
        Safe because this transaction writes next: a writer that committed since it began makes the
        write fail (``SQLITE_BUSY``), never collide silently."""
        if self.pg:
            self.cur.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
                             (table, n))
            return [r[0] for r in self.cur.fetchall()]
        self.cur.execute(f'SELECT coalesce(max(id), 0) FROM "{table}"')
        top = self.cur.fetchone()[0]
        return list(range(top + 1, top + 1 + n))

    def add(self, t: RawTable, rows: list[dict[str, Any]], patch: str | None = None) -> None:
        """Insert new rows and set each row's ``id`` (see :func:`params_with_ids`)."""
        self.put(t, params_with_ids(t, rows, self.new_ids(t.name, len(rows)), patch), "id")

    def put(self, t: RawTable, params: list[list[Any]], *extra: str, into: str | None = None) -> None:
        """Insert parameter lists (the table's columns, then ``extra``) into ``t``, or into the table
        ``into`` names (quoted SQL, e.g. a staging table with those columns): COPY on PostgreSQL."""
        target = into or f'"{t.name}"'
        if self.pg:
            with self.cur.copy(f"COPY {target} ({t.quoted(*extra)}) FROM STDIN") as cp:
                for vals in params:
                    cp.write_row(vals)
            return
        self.cur.executemany(f"INSERT INTO {target} ({t.quoted(*extra)}) "
                             f"VALUES ({self.marks(len(t.cols) + len(extra))})", params)

    def update(self, t: RawTable, rows: list[dict[str, Any]]) -> None:
        sets = ", ".join(f'"{c}" = {self.ph}' for c in t.cols)
        params = [(*t.values(r), r["id"]) for r in rows]
        self.cur.executemany(f'UPDATE "{t.name}" SET {sets} WHERE id = {self.ph}', params)

    def delete_in(self, table: str, col: str, ids: list[int]) -> None:
        for i in range(0, len(ids), IN_CHUNK):
            part = ids[i:i + IN_CHUNK]
            self.cur.execute(f'DELETE FROM "{table}" WHERE "{col}" IN ({self.marks(len(part))})', part)


def _new_job(key: tuple[str, int]) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(_JOB_COLS)
    row.update(cluster=key[0], job_id=key[1], record_source="hook", gpu_count=0, backend="none", enriched=False)
    return row


def _fold(job: dict[str, Any], gpus: dict[tuple[str, int], dict[str, Any]], rec: dict[str, Any], node: str,
          now: datetime) -> None:
    """Apply one node record to the in-memory job and its GPU rows (the merge rules of the module doc)."""
    if job["record_source"] == "backfill":  # the hook's record came after all (storage/enrich.py, issue 3):
        job["record_source"], job["reason"] = "hook", None  # it replaces the allocation-only backfill,
        gpus.clear()  # whose GPU rows were placeholders (sacct keeps no GPU indexes)
    start, end = _utc(rec.get("start_time")), _utc(rec["end_time"])
    mine = {k[1]: r for k, r in gpus.items() if k[0] == node} if gpus else {}
    for idx in mine:
        del gpus[(node, idx)]
    backend = rec["backend"]
    for g in rec["gpus"]:
        get = g.get
        row = mine.pop(g["index"], None) or dict.fromkeys(_GPU_COLS)
        row.update(zip(_GPU_FIELDS, map(get, _GPU_FIELDS), strict=True))  # C-level copy of the fields
        row["node"], row["gpu_index"] = node, g["index"]
        peak = get("memory_used_peak_bytes")
        row["memory_used_peak_bytes"] = int(peak) if peak is not None else None
        row["uuid"] = _cut(get("uuid"), 96)
        row["pci_bus_id"] = _cut(get("pci_bus_id"), 32)
        row["model"] = _cut(get("model"), 128)
        row["start_time"], row["end_time"] = start, end
        row["source"] = _cut(get("source") or backend, 16)
        row["samples"] = get("samples") or 0
        row["missing"] = dict(get("missing") or {})
        gpus[(node, g["index"])] = row
    all_rows = sorted(gpus.values(), key=lambda r: (r["node"] == node, r.get("id") or 0))
    nodes = set(filter(None, (job["nodelist"] or "").split(","))) | {r["node"] for r in all_rows} | {node}
    job["nodelist"] = _cut(",".join(sorted(nodes)), 1024)
    job["gpu_count"] = len(all_rows)
    models = sorted({r["model"] for r in all_rows if r["model"]})
    job["backend"] = max((r["source"] for r in all_rows), key=lambda s: _BACKEND_RANK.get(s, 0),
                         default=rec["backend"])
    if rec.get("reason"):
        parts = set(filter(None, (job["reason"] or "").split("; "))) | set(rec["reason"].split("; "))
        job["reason"] = _cut("; ".join(sorted(parts)), 1024)
    for key, size in _IDENTITY:
        value = rec.get(key)
        if value is not None and (job[key] is None or not job["enriched"]):
            job[key] = _cut(value, size) if size else value
    if not job["enriched"]:  # sacct enrichment owns these once it has run
        job["gpu_type"] = _cut(", ".join(models), 128) if models else job["gpu_type"]
        job["start_time"] = _merge([job["start_time"], start], min)
        job["end_time"] = _merge([job["end_time"], end], max)
        job["elapsed_s"] = ((job["end_time"] - job["start_time"]).total_seconds()
                            if job["start_time"] is not None and job["end_time"] is not None else None)
        job["exit_code"] = _merge([job["exit_code"], rec.get("exit_code")], max)
        job["signal"] = _merge([job["signal"], rec.get("signal")], max)
        job["state"] = _state(job["exit_code"], job["signal"])
    if job["ingested_at"] is None:
        job["ingested_at"] = now
    job["analyzed_at"] = None  # new data: the stored summary (slurm_gpueff.summarize) must be recomputed
