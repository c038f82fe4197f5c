"""Parallel ingest: several worker processes drain one spool backlog (``[ingest] workers``).

Why processes: one ingest process spends ~85 % of its time in Python (reading, parsing, validating and
merging records, building parameters) and ~15 % in the database. On a service host draining hundreds of
nodes, or a backlog after the database was down, the cores are there to share the Python part.

How it stays as safe as one process (see :mod:`slurm_gpueff.storage.ingest`):

* the backlog is cut into batches that never split one job's node records (grouped by the job id in the
  file name: :func:`slurm_gpueff.spool.pending_by_job`), so two workers never merge the same job;
* each worker runs the serial batch code (read, validate, quarantine, one transaction per batch) and
  reports which files its committed batches hold; this process removes them, only after the commit;
* PostgreSQL: workers write concurrently, each on its own connection. SQLite has one writer at a time,
  so workers prepare their batch outside a shared lock and only check and write under it
  (:class:`SqliteTurn`), and this process checkpoints the WAL in the background meanwhile
  (:class:`_Checkpointer`) so that no writer does it holding the lock;
* a database that becomes unavailable stops the run: batches not started are left in the spool and
  counted as failed, as in serial ingest; a worker that dies (killed, out of memory) loses only its
  uncommitted batch, whose files stay for the next run.

Worker processes are forked when this process runs a single thread (``gpueff ingest``: cheap start-up);
from a threaded process (``gpueff serve``) they come from a fork server, which is safe with threads.
"""

from __future__ import annotations

import logging
import multiprocessing
import sqlite3
import threading
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from . import ingest
from .db import make_engine

log = logging.getLogger(__name__)

_engine: Engine | None = None  # the worker process's own engine (never the parent's connections)
_turn: SqliteTurn | None = None
CHECKPOINT_EVERY_S = 0.25
RAMP_MIN = 10  # files in the smallest of the first batches (:func:`batches`)
STAGE = "gpueff_stage_"  # prefix of a worker connection's temporary tables (:meth:`_Ready.stage`)


@dataclass
class _Ready:
    """A batch of new jobs with every parameter built, ids included, waiting for the writer's turn."""

    tables: Any
    jobs: list[list[Any]]
    gpus: list[list[Any]]
    timelines: list[list[Any]]
    ranges: list[tuple[str, str, int, int]]  # (table, id column, first, last) reserved for it

    def holds(self, conn: Connection, plan: ingest.Plan) -> bool:
        """Still true: none of its jobs is stored, and no other writer took an id of its ranges.

        It runs under the writers' lock, so it asks only that, in raw SQL: :meth:`ingest.Plan.current`
        (the general check, for plans that read stored rows) builds SQLAlchemy statements and row dicts,
        which cost 3-5 µs of lock time per record on a 2-CPU VM; these queries, about 1."""
        db = ingest.RawWriter(conn)
        cur = db.cur
        ids = sorted({k[1] for k in plan.keys})
        for i in range(0, len(ids), ingest.IN_CHUNK):
            part = ids[i:i + ingest.IN_CHUNK]
            cur.execute(f'SELECT cluster, job_id FROM "job" WHERE job_id IN ({db.marks(len(part))})', part)
            if any(tuple(row) in plan.keys for row in cur.fetchall()):
                return False
        for table, col, lo, hi in self.ranges:
            if hi >= lo and cur.execute(f'SELECT 1 FROM "{table}" WHERE "{col}" BETWEEN ? AND ? LIMIT 1',
                                        (lo, hi)).fetchone():
                return False
        return True

    def _parts(self) -> list[tuple[Any, list[list[Any]], tuple[str, ...]]]:
        jt, gt, tt = self.tables
        return [(jt, self.jobs, ("id",)), (gt, self.gpus, ("id",)), (tt, self.timelines, ())]

    def stage(self, conn: Connection) -> None:
        """Put the rows into this connection's temporary tables, outside the writers' lock.

        The temporary tables (one per table, ``gpueff_stage_<table>``) have no index, constraint or
        type, so they store the parameters exactly as bound; SQLite keeps them per connection and
        writing them takes no lock on the database file. Their own short transaction is committed
        here, so the write turn starts a fresh one (its snapshot is taken under the lock). Left-over rows
        of an earlier batch (one whose turn failed) are cleared first."""
        with conn.begin(), ingest.raw_errors(conn):
            db = ingest.RawWriter(conn)
            for t, params, extra in self._parts():
                stage = f'temp."{STAGE}{t.name}"'
                db.cur.execute(f"CREATE TABLE IF NOT EXISTS {stage} ({t.quoted(*extra)})")
                db.cur.execute(f"DELETE FROM {stage}")
                if params:
                    db.put(t, params, *extra, into=stage)

    def put(self, conn: Connection) -> None:
        """Copy the staged rows into the tables: ``INSERT .. SELECT`` runs inside SQLite, with no
        per-value binding from Python. The writers' lock is held 15-17 instead of 44 µs per record
        for it on a 2-CPU VM (docs/bench/). The tables' type affinities and constraints apply on the
        way in, as they would to the bound parameters."""
        cur = ingest.RawWriter(conn).cur
        with ingest.raw_errors(conn):
            for t, params, extra in self._parts():
                if params:
                    cols = t.quoted(*extra)
                    cur.execute(f'INSERT INTO main."{t.name}" ({cols}) SELECT {cols} FROM temp."{STAGE}{t.name}"')


class SqliteTurn:
    """Parallel ingest into SQLite: prepare a batch outside the writers' lock, check and write under it.

    SQLite has one writer at a time, so what a worker does while holding the lock bounds the whole run.
    Outside it: reading and merging (:func:`ingest.plan_records`) and, for a batch whose jobs are not
    stored yet (the usual case in a backlog), every parameter, the new rows' ids included, taken from
    ranges reserved in counters shared by the workers, and the rows themselves, written into the
    connection's temporary tables (:meth:`_Ready.stage`). Under it: one check that the plan still holds
    (none of its jobs stored since; its id ranges still free, since another writer, e.g. enrichment,
    takes the next ids itself), three ``INSERT .. SELECT`` from the temporary tables, the commit. A
    plan that no longer holds, or a batch that updates stored jobs, is planned and written under the
    lock by the serial code.
    """

    def __init__(self, lock: Any, next_ids: dict[str, Any] | None) -> None:
        self.lock = lock
        self.next_ids = next_ids  # table -> multiprocessing.Value("q"): the next id nobody has reserved

    def reserve(self, table: str, n: int) -> int:
        """The first of ``n`` ids no other worker of this run will use."""
        assert self.next_ids is not None
        counter = self.next_ids[table]
        with counter.get_lock():
            first = counter.value
            counter.value = first + n
        return first

    def write(self, engine: Engine, recs: list[dict[str, Any]]) -> None:
        with engine.connect() as conn:  # one connection throughout: the staged rows are its own
            plan = ingest.plan_records(conn, recs)
            conn.rollback()
            ready = self._prepare(plan) if self.next_ids is not None and not plan.old_jobs else None
            if ready is not None:
                ready.stage(conn)
            with self.lock, conn.begin():
                if ready is not None and ready.holds(conn, plan):
                    ready.put(conn)
                    return
                if ready is not None or not plan.current(conn):  # (a prepared plan's rows carry their ids)
                    plan = ingest.plan_records(conn, recs)
                ingest.apply_plan(conn, plan)

    def _prepare(self, plan: ingest.Plan) -> _Ready:
        """Ids and full parameter lists for a plan of new jobs only, from reserved ranges."""
        jt, gt, _tt = plan.tables
        jobs = list(plan.jobs.values())
        j0 = self.reserve("job", len(jobs))
        jp = ingest.params_with_ids(jt, jobs, range(j0, j0 + len(jobs)))
        gpus, _updates, _kept = ingest.plan_gpu_rows(plan.gpus, plan.jobs, plan.touched)  # all new: inserts
        g0 = self.reserve("job_gpu", len(gpus))
        g1 = g0 + len(gpus) - 1
        gp = ingest.params_with_ids(gt, gpus, range(g0, g1 + 1), patch="job_pk")
        return _Ready(plan.tables, jp, gp, ingest.timeline_params(plan),
                      [("job", "id", j0, j0 + len(jobs) - 1), ("job_gpu", "id", g0, g1),
                       ("job_gpu_timeline", "job_gpu_id", g0, g1)])


def id_counters(engine: Engine, ctx: Any = multiprocessing) -> dict[str, Any]:
    """Counters of the next free id of ``job`` and ``job_gpu``, shareable with ``ctx``'s processes."""
    with engine.connect() as conn:
        nxt = {t: conn.exec_driver_sql(f'SELECT coalesce(max(id), 0) + 1 FROM "{t}"').scalar()
               for t in ("job", "job_gpu")}
    return {t: ctx.Value("q", v) for t, v in nxt.items()}


class _Checkpointer(threading.Thread):
    """Checkpoints the SQLite WAL while workers write, so that no writer does it during its turn.

    Workers' connections turn automatic checkpoints off; a PASSIVE checkpoint runs alongside writers
    (it never blocks them). The last one begins when the last batch is in, while the worker processes
    exit (~20 ms for 8 on 16 CPUs; the last checkpoint itself took ~30 ms there).
    """

    def __init__(self, path: str) -> None:
        super().__init__(name="gpueff-wal-checkpoint", daemon=True)
        self.path = path
        self.done = threading.Event()

    def run(self) -> None:
        try:
            con = sqlite3.connect(self.path, timeout=30)
        except sqlite3.Error as exc:  # the workers' own autocheckpoint is off: say so, they still commit
            log.warning("cannot open %s to checkpoint its WAL: %s", self.path, exc)
            return
        try:
            while not self.done.wait(CHECKPOINT_EVERY_S):
                self._checkpoint(con)
            self._checkpoint(con)
        finally:
            con.close()

    @staticmethod
    def _checkpoint(con: sqlite3.Connection) -> None:
        try:
            con.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:  # busy or I/O trouble: SQLite checkpoints again later on its own
            log.debug("WAL checkpoint: %s", exc)

    def finish(self) -> None:
        """Begin the last checkpoint now, without waiting for it (:meth:`stop` waits)."""
        self.done.set()

    def stop(self) -> None:
        self.finish()
        if self.ident is not None:  # started
            self.join()


def batches(jobs: list[list[str]], step: int, workers: int) -> list[list[str]]:
    """Cut ``jobs`` (groups of one job's node records: :func:`spool.group_by_job`) into batches of at most
    ~``step`` files, a job's records always together and in their order.

    Batches are made small enough that every worker gets several (load balance) but no smaller than 50
    files (a transaction per batch), except the first ``workers - 1``, which ramp up from 1/``workers``
    of that size: with equal batches, the first write waits until a whole batch is prepared and the
    first turns come all at once, while SQLite's one writer idles (measured on 16 CPUs: 20-30 % of a
    run, with the writers' lock then busy 99 % of the time). Ramped, the first batch is ready early and
    the next ones follow as the lock frees.
    """
    total = sum(map(len, jobs))
    size = max(50, min(step, -(-total // (workers * 4))))
    ramp = [max(RAMP_MIN, size * (k + 1) // workers) for k in range(workers - 1)]
    out: list[list[str]] = []
    cur: list[str] = []
    for group in jobs:
        if cur and len(cur) + len(group) > (ramp[len(out)] if len(out) < len(ramp) else size):
            out.append(cur)
            cur = []
        cur.extend(group)
    if cur:
        out.append(cur)
    return out


def drain_parallel(engine: Engine, spool_dir: str, jobs: list[list[str]], step: int, res: ingest.IngestResult,
                   unlinker: Any, progress: Callable[[int, int], None] | None, workers: int) -> None:
    """Drain ``jobs`` (:func:`batches`) with ``workers`` processes; results are added to ``res`` (as
    ``ingest._drain``)."""
    todo = batches(jobs, step, workers)
    total = sum(map(len, todo))
    url = engine.url.render_as_string(hide_password=False)
    method = "fork" if threading.active_count() == 1 else "forkserver"
    ctx = multiprocessing.get_context(method)
    log.info("ingesting %d records in %d batches with %d worker processes (%s)", total, len(todo),
             min(workers, len(todo)), method)
    turn = checkpointer = None
    if engine.dialect.name == "sqlite":
        turn = SqliteTurn(ctx.Lock(), id_counters(engine, ctx))
        checkpointer = _Checkpointer(str(engine.url.database))
    try:
        _run_pool(ctx, url, turn, checkpointer, spool_dir, todo, workers, res, unlinker, progress, total)
    finally:
        if checkpointer is not None:
            checkpointer.stop()


def _run_pool(ctx: Any, url: str, turn: SqliteTurn | None, checkpointer: _Checkpointer | None, spool_dir: str,
              todo: list[list[str]], workers: int, res: ingest.IngestResult, unlinker: Any,
              progress: Callable[[int, int], None] | None, total: int) -> None:
    done = 0
    stopped = False
    with ProcessPoolExecutor(max_workers=min(workers, len(todo)), mp_context=ctx, initializer=_init,
                             initargs=(url, turn)) as pool:
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
        if checkpointer is not None:  # only now: forked workers must not inherit a thread inside SQLite
            checkpointer.start()
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
                except Exception as exc:  # noqa: BLE001 - a bug in a worker: keep the files, stop the run
                    _lost(res, chunk, f"an ingest worker failed ({type(exc).__name__}: {exc}); its files stay "
                                      "for the next run")
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
        if checkpointer is not None:  # every batch is in: the last checkpoint runs while the workers exit
            checkpointer.finish()


def _lost(res: ingest.IngestResult, chunk: list[str], msg: str) -> None:
    res.failed += len(chunk)
    res.errors.append(msg)
    log.error(msg)


def _init(url: str, turn: SqliteTurn | None) -> None:
    global _engine, _turn
    _engine = make_engine(url, create=False)
    if turn is not None:  # the parent checkpoints the WAL (_Checkpointer)
        event.listen(_engine, "connect", _worker_pragmas)
    _turn = turn


def _worker_pragmas(dbapi_conn: Any, _rec: Any) -> None:
    """SQLite worker connections: the parent checkpoints the WAL (:class:`_Checkpointer`); staged rows
    (:meth:`_Ready.stage`) stay in memory."""
    dbapi_conn.execute("PRAGMA wal_autocheckpoint=0")
    dbapi_conn.execute("PRAGMA temp_store=MEMORY")


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
        ok = ingest.drain_batch(_engine, spool_dir, chunk, part, committed, left_after=0, turn=_turn)
    return part, committed.paths, not ok
