"""Parallel ingest: several worker processes drain one spool backlog (``[ingest] workers``).

Why processes: one ingest process spends ~85 % of its time in Python (reading, parsing, validating and
merging records, building parameters) and ~15 % in the database. On a service host draining hundreds of
nodes, or a backlog after the database was down, the cores are there to share the Python part.

How it stays as safe as one process (see :mod:`slurm_gpueff.storage.ingest`):

* the backlog is cut into batches that never split one job's node records (grouped by the job id in the
  file name), so two workers never merge the same job;
* each worker runs the serial batch code (read, validate, quarantine, one transaction per batch) and
  reports which files its committed batches hold; this process removes them, only after the commit;
* PostgreSQL: workers write concurrently, each on its own connection. SQLite has one writer at a time,
  so workers plan their batch outside a shared lock and only check and write under it
  (``ingest._write_batch``);
* a database that becomes unavailable stops the run: batches not started are left in the spool and
  counted as failed, as in serial ingest; a worker that dies (killed, out of memory) loses only its
  uncommitted batch, whose files stay for the next run.

Worker processes are forked when this process runs a single thread (``gpueff ingest``: cheap start-up);
from a threaded process (``gpueff serve``) they come from a fork server, which is safe with threads.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from sqlalchemy.engine import Engine

from . import ingest
from .db import make_engine

log = logging.getLogger(__name__)

_engine: Engine | None = None  # the worker process's own engine (never the parent's connections)
_lock: Any = None


def batches(paths: list[str], step: int, workers: int) -> list[list[str]]:
    """Cut ``paths`` into batches of at most ~``step`` files, a job's node records always together.

    Batches are made small enough that every worker gets several (load balance) but no smaller than 50
    files (a transaction per batch). The job id comes from the file name (``job-<id>-<node>.json``); a
    file named otherwise is a batch member like any other (it is quarantined or ingested on its own).
    """
    size = max(50, min(step, -(-len(paths) // (workers * 4))))
    by_job: dict[str, list[str]] = {}
    for p in paths:
        parts = os.path.basename(p).split("-", 2)
        by_job.setdefault(parts[1] if len(parts) == 3 else p, []).append(p)
    out: list[list[str]] = []
    cur: list[str] = []
    for group in by_job.values():
        if cur and len(cur) + len(group) > size:
            out.append(cur)
            cur = []
        cur.extend(group)
    if cur:
        out.append(cur)
    return out


def drain_parallel(engine: Engine, spool_dir: str, paths: list[str], step: int, res: ingest.IngestResult,
                   unlinker: Any, progress: Callable[[int, int], None] | None, workers: int) -> None:
    """Drain ``paths`` with ``workers`` processes; results are added to ``res`` (as ``ingest._drain``)."""
    todo = batches(paths, step, workers)
    url = engine.url.render_as_string(hide_password=False)
    ctx = multiprocessing.get_context("fork" if threading.active_count() == 1 else "forkserver")
    lock = ctx.Lock() if engine.dialect.name == "sqlite" else None
    total, done = len(paths), 0
    stopped = False
    with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx, initializer=_init,
                             initargs=(url, lock)) as pool:
        running: dict[Future, list[str]] = {}
        queue = list(reversed(todo))

        def fill() -> None:
            while queue and len(running) < 2 * workers:  # a little ahead, never the whole backlog at once
                chunk = queue.pop()
                running[pool.submit(_work, spool_dir, chunk)] = chunk

        try:
            fill()
        except BrokenProcessPool as exc:
            _lost(res, [p for c in queue for p in c], f"worker processes could not start: {exc}")
            return
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                chunk = running.pop(fut)
                try:
                    part, committed, unavailable = fut.result()
                except BrokenProcessPool as exc:  # a worker died: its batch was not committed
                    _lost(res, chunk, f"an ingest worker died ({exc}); its files stay for the next run")
                    stopped = True
                    continue
                res.ingested += part.ingested
                res.quarantined += part.quarantined
                res.failed += part.failed
                res.errors.extend(part.errors)
                unlinker.submit(committed)
                stopped = stopped or unavailable
                done += len(chunk)
                if progress is not None:
                    progress(min(done, total), total)
            if stopped:
                if queue:
                    left = sum(len(c) for c in queue)
                    res.failed += left
                    res.errors.append(f"{left} record(s) not attempted after the failure above; "
                                      "left in the spool for the next run")
                    queue.clear()
            else:
                fill()


def _lost(res: ingest.IngestResult, chunk: list[str], msg: str) -> None:
    res.failed += len(chunk)
    res.errors.append(msg)
    log.error(msg)


def _init(url: str, lock: Any) -> None:
    global _engine, _lock
    _engine = make_engine(url, create=False)
    _lock = lock


class _Committed:
    """Stands in for the unlinker in a worker: collects committed files for the parent to remove."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def submit(self, paths: list[str]) -> None:
        self.paths.extend(paths)


def _work(spool_dir: str, chunk: list[str]) -> tuple[ingest.IngestResult, list[str], bool]:
    """One batch in a worker: (its result, the committed files, whether the database was unavailable)."""
    assert _engine is not None
    part = ingest.IngestResult()
    committed = _Committed()
    with ingest.no_cyclic_gc():
        ok = ingest.drain_batch(_engine, spool_dir, chunk, part, committed, left_after=0, lock=_lock)
    return part, committed.paths, not ok
