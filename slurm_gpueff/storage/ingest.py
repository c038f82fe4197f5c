"""Ingest: drain the spool into the database, losing nothing and duplicating nothing.

For each record in ``<spool>/incoming/`` (oldest first):

* unreadable or invalid (empty file, bad JSON, wrong schema, impossible values: :func:`record.validate`)
  -> :func:`spool.quarantine` with an ``.error`` file naming the problem; ingest goes on;
* valid -> :func:`ingest_record` upserts the job (natural key cluster, job_id) and that node's GPUs
  (job, node, gpu_index) with their timelines, in a transaction shared by up to ``BATCH`` records;
  the files are unlinked only **after** the commit.

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
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from .. import record as recmod
from .. import spool
from ..errors import RecordError
from ..models import Job, JobGpu, JobGpuTimeline

log = logging.getLogger(__name__)

BATCH = 200
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


class _Unavailable(Exception):
    """The database could not be written; carries the original error."""


def read_record(path: str) -> dict[str, Any]:
    """Parse and validate one spool file; RecordError says what is wrong with it."""
    with open(path, "rb") as fh:
        data = fh.read()
    if not data.strip():
        raise RecordError("empty file")
    try:
        rec = json.loads(data)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
        raise RecordError(f"not valid JSON: {exc}") from None
    return recmod.validate(rec)


def ingest_spool(engine: Engine, spool_dir: str, *, limit: int | None = None,
                 progress: Callable[[int, int], None] | None = None) -> IngestResult:
    """Drain ``spool_dir``'s incoming records into the database (at most ``limit`` files).

    ``progress(done, total)`` is called after each batch. Never raises for a bad record or an
    unavailable database; see :class:`IngestResult`.
    """
    res = IngestResult()
    spool.clean_stale_tmp(spool_dir)
    paths = list(spool.pending(spool_dir))
    if limit is not None:
        paths = paths[: max(0, limit)]
    total = len(paths)
    for start in range(0, total, BATCH):
        batch = paths[start:start + BATCH]
        good: list[tuple[str, dict[str, Any]]] = []
        for path in batch:
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
            _ingest_batch(engine, spool_dir, good, res)
        except _Unavailable as exc:
            left = len(good) + len(paths) - (start + len(batch))
            res.failed += left
            msg = (f"database unavailable ({exc.__cause__}); {left} record(s) left in the spool "
                   "for the next run")
            res.errors.append(msg)
            log.error(msg)
            return res
        if progress is not None:
            progress(min(start + len(batch), total), total)
    return res


def _ingest_batch(engine: Engine, spool_dir: str, good: list[tuple[str, dict[str, Any]]],
                  res: IngestResult) -> None:
    if not good:
        return
    try:
        with Session(engine) as session:
            for _path, rec in good:
                ingest_record(session, rec)
            session.commit()
    except UNAVAILABLE as exc:
        raise _Unavailable() from exc
    except Exception as exc:  # noqa: BLE001 - some record in the batch: find it, one per transaction
        log.warning("batch of %d records failed (%s); retrying one by one", len(good), exc)
        _one_by_one(engine, spool_dir, good, res)
        return
    for path, _rec in good:
        _done(path, res)


def _one_by_one(engine: Engine, spool_dir: str, good: list[tuple[str, dict[str, Any]]],
                res: IngestResult) -> None:
    """Retry a failed batch record by record and quarantine the records the database rejects.

    Records were validated before: a database that rejects all of them points at the software or the
    schema, not at the records, so then nothing is quarantined: the files stay for the next run.
    """
    rejected: list[tuple[str, Exception]] = []
    stored = 0
    for path, rec in good:
        try:
            with Session(engine) as session:
                ingest_record(session, rec)
                session.commit()
        except UNAVAILABLE as exc:
            raise _Unavailable() from exc
        except sa_exc.IntegrityError as exc:  # a concurrent ingest inserted the same job: next run
            res.failed += 1
            res.errors.append(f"{path}: conflict, left for the next run: {exc.orig}")
            continue
        except Exception as exc:  # noqa: BLE001 - judged below
            rejected.append((path, exc))
            continue
        stored += 1
        _done(path, res)
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


def _done(path: str, res: IngestResult) -> None:
    """The record is committed: remove its file (already gone is fine: a concurrent ingest took it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    res.ingested += 1


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


_GPU_FIELDS = ("minor", "memory_total_bytes", *recmod.FRACTIONS, "energy_j", "power_mean_w")


def ingest_record(session: Session, rec: dict[str, Any]) -> Job:
    """Upsert one (validated) node record; idempotent and independent of the order nodes arrive in."""
    recmod.validate(rec)
    cluster, node = _cut(rec["cluster"], 64), _cut(rec["node"], 128)
    job = session.exec(select(Job).where(Job.cluster == cluster, Job.job_id == rec["job_id"])).first()
    if job is None:
        job = Job(cluster=cluster, job_id=rec["job_id"], record_source="hook")
        session.add(job)
        session.flush()
    start, end = _utc(rec.get("start_time")), _utc(rec["end_time"])

    rows = list(session.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all())
    mine = {r.gpu_index: r for r in rows if r.node == node}
    others = [r for r in rows if r.node != node]
    current: list[tuple[JobGpu, dict[str, Any]]] = []
    for g in rec["gpus"]:
        row = mine.pop(g["index"], None)
        if row is None:
            row = JobGpu(job_pk=job.id, node=node, gpu_index=g["index"])
            session.add(row)
        for f in _GPU_FIELDS:
            setattr(row, f, g.get(f))
        peak = g.get("memory_used_peak_bytes")
        row.memory_used_peak_bytes = int(peak) if peak is not None else None
        row.uuid = _cut(g.get("uuid"), 96)
        row.pci_bus_id = _cut(g.get("pci_bus_id"), 32)
        row.model = _cut(g.get("model"), 128)
        row.start_time, row.end_time = start, end
        row.source = _cut(g.get("source") or rec["backend"], 16)
        row.samples = g.get("samples") or 0
        row.missing = dict(g.get("missing") or {})
        current.append((row, g))
    if mine:  # GPUs this node no longer reports: their timelines first (no reliance on FK cascades)
        gone = [r.id for r in mine.values()]
        session.execute(delete(JobGpuTimeline).where(col(JobGpuTimeline.job_gpu_id).in_(gone)))
        session.execute(delete(JobGpu).where(col(JobGpu.id).in_(gone)))
        for r in mine.values():
            session.expunge(r)
    session.flush()
    for row, g in current:
        tl = session.get(JobGpuTimeline, row.id)
        points = g.get("timeline") or []
        if points:
            if tl is None:
                session.add(JobGpuTimeline(job_gpu_id=row.id, points=points))
            elif tl.points != points:
                tl.points = points
        elif tl is not None:
            session.delete(tl)

    all_rows = others + [r for r, _g in current]
    nodes = set(filter(None, (job.nodelist or "").split(","))) | {r.node for r in all_rows} | {node}
    job.nodelist = _cut(",".join(sorted(nodes)), 1024)
    job.gpu_count = len(all_rows)
    models = sorted({r.model for r in all_rows if r.model})
    job.backend = max((r.source for r in all_rows), key=lambda s: _BACKEND_RANK.get(s, 0),
                      default=rec["backend"])
    if rec.get("reason"):
        parts = set(filter(None, (job.reason or "").split("; "))) | set(rec["reason"].split("; "))
        job.reason = _cut("; ".join(sorted(parts)), 1024)
    for key, size in (("array_job_id", None), ("array_task_id", None), ("het_job_id", None),
                      ("het_job_offset", None), ("user", 128), ("uid", None), ("account", 128),
                      ("partition", 128)):
        value = rec.get(key)
        if value is not None and (getattr(job, key) is None or not job.enriched):
            setattr(job, key, _cut(value, size) if size else value)
    if not job.enriched:  # sacct enrichment owns these once it has run
        job.gpu_type = _cut(", ".join(models), 128) if models else job.gpu_type
        job.start_time = _merge([job.start_time, start], min)
        job.end_time = _merge([job.end_time, end], max)
        job.elapsed_s = ((job.end_time - job.start_time).total_seconds()
                         if job.start_time is not None and job.end_time is not None else None)
        job.exit_code = _merge([job.exit_code, rec.get("exit_code")], max)
        job.signal = _merge([job.signal, rec.get("signal")], max)
        job.state = _state(job.exit_code, job.signal)
    if job.ingested_at is None:
        job.ingested_at = datetime.now(UTC).replace(tzinfo=None)
    job.analyzed_at = None  # new data: the stored summary (slurm_gpueff.summarize) must be recomputed
    session.add(job)
    session.flush()
    return job
