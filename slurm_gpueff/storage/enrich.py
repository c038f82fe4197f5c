"""Slurm accounting into the job rows: enrichment of hook records, backfill of missing ones (docs/DESIGN.md
"Data flow", step 5).

Enrichment is written once, so it waits until accounting is final: a job sacct still reports as running
or does not know yet (slurmdbd lags the controller) is retried by the next run, and so is one that ended
less than ``settle_s`` ago, because slurmdbd records a finished array task's array ids seconds *after*
its final state (seen on 22.05: ``5|5|COMPLETED`` for 1-4 s, then ``5_1|5|COMPLETED``). A reader
failure (sacct absent, slow, slurmdbd down) changes nothing and is reported. The reader is passed in
(``jobs(ids, cluster)``, e.g. ``slurm_gpueff.slurm.sacct.SacctReader``), so this module needs no Slurm.
"""

from __future__ import annotations

import functools
import itertools
import pwd
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import itemgetter
from typing import Any

from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from .. import record as recmod
from ..config import SacctConfig
from ..models import AlertLog, Job, JobGpu, not_live
from ..slurm.jobid import is_digits
from ..slurm.sacct import SacctError, SacctJob
from .db import first_line
from .merge import LIVE_ONLY, cut, keep_measured, measured, utc
from .rollups import moved_month, note_moved
from .writer import UNAVAILABLE, ingest_record

BACKFILL_REASON = ("no GPU record from the Slurm hooks (node crash, hooks not installed, collector or spool "
                   "lost); allocation only, from Slurm accounting")
BACKFILL_WRITER = "slurm-gpueff backfill"
RUN_SLACK_S = 60.0  # a provisional run's hook times may lie this far outside accounting's (clocks, Epilog delay)


@dataclass
class EnrichResult:
    """What one enrich run did. ``errors`` non-empty means the run stopped early (retry later)."""

    checked: int = 0
    enriched: int = 0
    not_final: int = 0
    not_found: int = 0
    settling: int = 0  # final, but ended less than settle_s ago: accounting may still be filling it in
    errors: list[str] = field(default_factory=list)
    stopped: bool = False  # asked to stop (the service is stopping): the rest waits for the next run


@dataclass
class BackfillResult:
    """What one backfill run did with the sacct jobs it was given."""

    seen: int = 0
    created: int = 0
    enriched: int = 0        # had a hook record that was not enriched yet: enriched on the way
    had_record: int = 0
    no_gpus: int = 0
    not_final: int = 0
    created_ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# A live row whose snapshots stopped this long ago (three of the agent's default live intervals) is asked about:
# its final record normally replaces it within a minute of the job's end; one whose node never sent it (a node
# that died and stayed down, so no Epilog ran) is finished from accounting, so that an ended run is not listed
# as running for longer. A final record that comes after all still replaces it (storage/merge.py).
LIVE_QUIET_S = 900.0


def finish_live(job: Job) -> None:
    """A running job's live row whose node never sent the final record: its figures up to the last live
    record become the job's, and the reason says so."""
    job.record_source = "hook"
    job.reason = "; ".join(filter(None, (job.reason, LIVE_ONLY)))[:1024]


def apply_sacct(job: Job, sj: SacctJob) -> datetime | None:
    """Write what accounting says into ``job`` (a finished job): accounting wins where it knows. Returns the
    job's old end time when accounting moved it into another month (for rollups.note_moved), else None. A
    live row that gets here ends too: a run accounting calls ended is never listed as running."""
    if job.record_source == "live":
        finish_live(job)
    old_end = job.end_time
    for attr, value, size in (("user", sj.user, 128), ("account", sj.account, 128), ("partition", sj.partition, 128),
                              ("qos", sj.qos, 128), ("job_name", sj.job_name, 512)):
        if value is not None:
            setattr(job, attr, cut(value, size))
    if sj.uid is not None:
        job.uid = sj.uid
    # array / het ids: what the slurmd hooks cannot see
    job.array_job_id, job.array_task_id = sj.array_job_id, sj.array_task_id
    job.het_job_id, job.het_job_offset = sj.het_job_id, sj.het_job_offset
    if sj.nodes and not job.nodelist:
        job.nodelist = cut(",".join(sj.nodes), 1024)
    if sj.gpu_count:
        job.gpu_count = max(job.gpu_count or 0, sj.gpu_count)
    if sj.gpu_type and not job.gpu_type:
        job.gpu_type = cut(sj.gpu_type, 128)
    job.submit_time = utc(sj.submit) or job.submit_time
    job.start_time = utc(sj.start) or job.start_time
    job.end_time = utc(sj.end) or job.end_time
    if sj.elapsed_s is not None:
        job.elapsed_s = sj.elapsed_s
    elif job.start_time is not None and job.end_time is not None:
        job.elapsed_s = (job.end_time - job.start_time).total_seconds()
    # replaces the hook's provisional state; a run that a later run followed ended by its requeue
    job.state = cut(sj.state if sj.final else "REQUEUED", 32) or job.state
    job.sluid = cut(sj.sluid, 32) or job.sluid
    if sj.exit_code is not None:
        job.exit_code, job.signal = sj.exit_code, sj.signal
    for attr in ("alloc_cpus", "total_cpu_s", "max_rss_bytes"):  # the CPU side: None stays unknown
        if getattr(sj, attr) is not None:
            setattr(job, attr, getattr(sj, attr))
    job.enriched = True
    job.analyzed_at = None  # the stored summary depends on state and times
    return old_end if moved_month(old_end, job.end_time) else None


ALERT_CANCEL = "cancel"  # alert_log.action of the idle-GPU policy's cancel (analysis/idle.py CANCEL)


def note_cancel(session: Session, job: Job, sj: SacctJob) -> None:
    """Say on a cancelled run who cancelled it and why, in its reason (the card's Note, ``--json``'s
    ``reason``): gpueff's idle-GPU policy where its audit (``alert_log``) holds the cancel of this run (its
    scancel runs as root, so Slurm alone would name root), else whom Slurm's accounting names, where it does."""
    if sj.state != "CANCELLED":
        return
    audit = session.exec(select(AlertLog).where(
        AlertLog.cluster == job.cluster, AlertLog.job_id == job.job_id, AlertLog.run == job.run,
        AlertLog.action == ALERT_CANCEL, AlertLog.dry_run == False,  # noqa: E712
        col(AlertLog.outcome).startswith("cancelled")).order_by(col(AlertLog.at).desc())).first()
    if audit is not None:
        why = (f"cancelled by gpueff's idle-GPU policy ([alerts]) at {audit.at:%Y-%m-%d %H:%M} UTC: its GPUs were "
               f"idle ({audit.detail}) after two warnings mailed to the owner")
    elif sj.cancelled_by is None:
        return
    else:
        why = f"cancelled by {_who(sj.cancelled_by, job)} (Slurm's accounting)"
    parts = set(filter(None, (job.reason or "").split("; "))) | {why}
    job.reason = cut("; ".join(sorted(parts)), 1024)


def _who(by: str, job: Job) -> str:
    """``its owner alice (uid 1002)``, ``root (uid 0)``, ``bob (uid 1003)``, ``uid 1004`` or a name as given."""
    if not is_digits(by):
        return f"its owner {by}" if by == job.user else by
    uid = int(by)
    try:
        name: str | None = pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        name = None
    if uid == job.uid:
        return f"its owner {job.user or name or ''} (uid {uid})".replace("owner  (", "owner (")
    return f"{name} (uid {uid})" if name else f"uid {uid}"


def enrich_jobs(engine: Engine, reader: Any, *, since: datetime | None = None, limit: int | None = None,
                progress: Callable[[int, int], None] | None = None, settle_s: float = SacctConfig.settle_s,
                now: float | None = None, shard_counts: Callable[[str], dict[int, int]] | None = None,
                stop: Callable[[], bool] | None = None, between: Callable[[], None] | None = None) -> EnrichResult:
    """Enrich every unenriched job run (ended since ``since``) from ``reader``, committing batch by batch; runs
    that ended less than ``settle_s`` before ``now`` (epoch; default: the clock) wait for the next run. Each
    row is matched to its own run in ``sacct -D`` (:func:`match_run`). Never raises for sacct or database
    trouble: the run stops and says why in ``errors``; what was committed stays, the next run retries the rest.
    ``shard_counts``: a node's GPUs' shard counts (slurm.commands.shard_counter), for the share of a shared
    GPU a job held (:func:`apply_shards`). ``stop``, asked before each batch: when true the run ends there
    (``stopped``), what it committed kept; a large backlog is many sacct calls, and a stopping service waits
    for its running tasks. ``between``, called before each batch after the first: the service's ``make_way``
    (the nodes' pushes and users' questions go first)."""
    res = EnrichResult()
    batch = max(1, int(getattr(reader, "batch_size", SacctConfig.batch_size)))
    clock = now if now is not None else time.time()
    # A running job's live row is asked about only once its snapshots have stopped for a while: its final
    # record normally replaces it; one whose node never sent it (node crash) is finished here.
    quiet = datetime.fromtimestamp(clock - LIVE_QUIET_S, UTC).replace(tzinfo=None)
    stmt = (select(Job.id, Job.cluster, Job.job_id).where(col(Job.enriched).is_(False))
            .where(not_live() | (col(Job.end_time) < quiet))
            .order_by(col(Job.id)))
    if since is not None:  # jobs without an end time too
        stmt = stmt.where((col(Job.end_time) >= since) | col(Job.end_time).is_(None))
    if limit is not None:
        stmt = stmt.limit(max(0, limit))
    try:
        with Session(engine) as session:
            todo = sorted(session.exec(stmt).all(), key=itemgetter(1))  # by cluster, then oldest first
    except UNAVAILABLE as exc:
        res.errors.append(f"database unavailable ({first_line(exc)}); nothing enriched")
        return res
    done = 0
    for cluster, group in itertools.groupby(todo, key=itemgetter(1)):
        rows = [(pk, job_id) for pk, _cluster, job_id in group]
        for k in range(0, len(rows), batch):
            chunk = rows[k:k + batch]
            if stop is not None and stop():
                res.stopped = True
                return res
            if done and between is not None:
                between()
            try:
                found = runs_by_job(reader.jobs(sorted({j for _pk, j in chunk}), cluster, runs=True))
            except SacctError as exc:
                res.errors.append(str(exc))
                return res
            try:
                with Session(engine) as session:
                    moved: list[datetime | None] = []
                    for pk, job_id in chunk:
                        res.checked += 1
                        job = session.get(Job, pk)
                        if job is None or job.enriched:
                            continue
                        sj = match_run(job, found.get(job_id, []))
                        if sj is None:
                            res.not_found += 1
                            continue
                        if not ended(sj, found[job_id]):
                            res.not_final += 1
                            continue
                        if sj.end is not None and clock - sj.end < settle_s:
                            res.settling += 1
                            continue
                        if job.record_source == "live":
                            finish_live(job)
                        job = settle_run(session, job, sj)
                        if job.enriched:  # folded into a row of its run that accounting had already filled
                            continue
                        moved.append(apply_sacct(job, sj))
                        note_cancel(session, job, sj)
                        if sj.shards:
                            apply_shards(session, job, sj.shards, shard_counts or (lambda _node: {}))
                        res.enriched += 1
                    if any(moved):  # accounting moved these end times to another month: redo those rollups
                        note_moved(session.connection(), moved)
                    session.commit()
            except UNAVAILABLE as exc:
                res.errors.append(f"database unavailable ({first_line(exc)}); the next run retries")
                return res
            done += len(chunk)
            if progress is not None:
                progress(done, len(todo))
    return res


def apply_shards(session: Session, job: Job, shards: int, counts: Callable[[str], dict[int, int]]) -> None:
    """A job that held ``shards`` shards of a shared GPU (accounting's gres/shard) rather than whole GPUs:
    the GPU it was recorded on gets those shards and the GPU's own count, its share. Slurm's hooks cannot
    tell a shard job from a whole-GPU one (the same SLURM_JOB_GPUS), so until now the record claimed the
    whole GPU. Spread over several GPUs (a flag Slurm allows), how many came from each is not in
    accounting: their counts stay unknown and so do the job's GPU-hours (analysis/figures.py)."""
    gpus = list(session.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all())
    for gpu in gpus:
        gpu.shards = shards
        gpu.shard_count = counts(gpu.node).get(gpu.gpu_index) if len(gpus) == 1 else None
        if gpu.shard_count is None:
            why = (f"the job's {shards} shards came from {len(gpus)} GPUs in proportions accounting does not keep"
                   if len(gpus) > 1 else f"how many shards GPU {gpu.gpu_index} of {gpu.node} has is unknown "
                   "(scontrol show node -d did not say)")
            gpu.missing = {**(gpu.missing or {}), "shards": why}


def runs_by_job(sacct_jobs: Iterable[SacctJob]) -> dict[int, list[SacctJob]]:
    """sacct's records by raw job id, each job's runs in order, every one with its ``run`` (the reader sets
    it for ``runs=True``; else the restart count, else the place by start, as 22.05 has no count)."""
    by_job: dict[int, list[SacctJob]] = {}
    for sj in sacct_jobs:
        by_job.setdefault(sj.job_id, []).append(sj)
    for runs in by_job.values():
        runs.sort(key=lambda r: (_run_of(r), not r.start, r.start or 0.0, r.end or 0.0))  # never started: last
        for n, sj in enumerate(runs):
            if sj.run is None:
                sj.run = sj.restart_count if sj.restart_count is not None else n
    return by_job


def _run_of(sj: SacctJob) -> int:
    return sj.run if sj.run is not None else sj.restart_count if sj.restart_count is not None else -1


def ended(sj: SacctJob, runs: list[SacctJob]) -> bool:
    """Whether accounting's record of this run is final: the run is over (SacctJob.run_over), or a later run
    of the job exists (24.11 reports a requeued run ``PENDING,REQUEUED``, without an end at first)."""
    return sj.run_over or (bool(runs) and sj is not runs[-1])


def match_run(job: Job, runs: list[SacctJob]) -> SacctJob | None:
    """The sacct run of a job row: the same run index; for a run the Epilog could not settle (``run`` < 0),
    the run with the same SLUID (26.05+), else the one whose time span overlaps the row's the most."""
    if job.run >= 0:
        return next((sj for sj in runs if sj.run == job.run), None)
    runs = [sj for sj in runs if sj.start]  # a run that never started (cancelled while requeued) has no record
    if job.sluid and any(sj.sluid for sj in runs):
        return next((sj for sj in runs if sj.sluid == job.sluid), None)
    end = job.end_time.replace(tzinfo=UTC).timestamp() if job.end_time else None
    start = job.start_time.replace(tzinfo=UTC).timestamp() if job.start_time else end
    if end is None or start is None:
        return None

    def overlap(sj: SacctJob) -> float:
        s0, s1 = sj.start or 0.0, sj.end if sj.end is not None else float("inf")
        return min(end, s1) - max(start, s0) if start < end else -max(s0 - end, end - s1, 0.0)

    best = max(runs, key=overlap, default=None)
    return best if best is not None and overlap(best) >= -RUN_SLACK_S else None


def settle_run(session: Session, job: Job, sj: SacctJob) -> Job:
    """Give a row with a provisional run its run from accounting; where another row (another node's record)
    already holds that run, move this row's GPUs there and drop it. Returns the row that holds the run.

    Where that row is the run's live row (this final record is the run's first), the run has ended: the row
    becomes a hook record, and as at ingest (storage/merge.py) this record's GPUs replace the live ones,
    except where they measured nothing and the live ones did, whose figures up to their last reading stay;
    this record's reason joins the row's."""
    run = sj.run if sj.run is not None else job.run
    if job.run == run:
        return job
    other = session.exec(select(Job).where(Job.cluster == job.cluster, Job.job_id == job.job_id,
                                           Job.run == run)).first()
    if other is None:
        job.run = run
        session.add(job)
        session.flush()
        return job
    ending = other.record_source == "live" and job.record_source != "live"
    taken = {(g.node, g.gpu_index): g for g in session.exec(select(JobGpu).where(JobGpu.job_pk == other.id))}
    live = dict(taken) if ending else {}  # the live rows this record's do not replace keep a note
    for g in session.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all():
        have = taken.get((g.node, g.gpu_index))
        if have is not None and not (ending and _replaces(g, have)):
            session.delete(g)
            continue
        if have is not None:
            live.pop((g.node, g.gpu_index), None)
            session.delete(have)
        taken[(g.node, g.gpu_index)] = g
        g.job_pk = other.id or 0
        session.add(g)
    for have in live.values():
        if measured(functools.partial(getattr, have)):
            have.window = keep_measured({"window": have.window, "end_time": have.end_time})["window"]
            session.add(have)
    if ending:
        other.record_source = "hook"
        other.state = None  # accounting's comes next (apply_sacct)
    parts = set(filter(None, f"{other.reason or ''}; {job.reason or ''}".split("; ")))
    other.reason = cut("; ".join(sorted(parts)), 1024) or None
    nodes = set(filter(None, f"{other.nodelist or ''},{job.nodelist or ''}".split(","))) | {n for n, _i in taken}
    other.nodelist = cut(",".join(sorted(nodes)), 1024)
    other.gpu_count = len(taken)
    other.analyzed_at = None
    session.delete(job)
    session.flush()
    return other


def _replaces(new: JobGpu, live: JobGpu) -> bool:
    """Whether a final record's GPU row replaces the run's live row of the same GPU: unless it measured
    nothing where the live one had figures."""
    return measured(functools.partial(getattr, new)) or not measured(functools.partial(getattr, live))


def backfill_jobs(engine: Engine, sacct_jobs: Iterable[SacctJob], *, default_cluster: str,
                  progress: Callable[[int, int], None] | None = None) -> BackfillResult:
    """Allocation-only records for finished GPU jobs in ``sacct_jobs`` that have no job row yet."""
    res = BackfillResult()
    todo = list(sacct_jobs)
    for n, sj in enumerate(todo, 1):
        res.seen += 1
        if not sj.gpu_count or sj.start is None:
            res.no_gpus += 1
        elif not sj.final:
            res.not_final += 1
        else:
            try:
                _backfill_one(engine, sj, default_cluster, res)
            except UNAVAILABLE as exc:
                res.errors.append(f"database unavailable ({first_line(exc)}); the next run retries")
                return res
            except (sa_exc.SQLAlchemyError, ValueError) as exc:
                res.errors.append(f"job {sj.job_id_text}: {type(exc).__name__}: {first_line(exc)}")
        if progress is not None and (n % 50 == 0 or n == len(todo)):
            progress(n, len(todo))
    return res


def _backfill_one(engine: Engine, sj: SacctJob, default_cluster: str, res: BackfillResult) -> None:
    cluster = (sj.cluster or default_cluster)[:64]
    with Session(engine) as session:
        same = select(Job).where(Job.cluster == cluster, Job.job_id == sj.job_id)
        # this run's row; without a restart count (22.05), the job's latest (sacct without -D: its last run)
        job = session.exec(same.where(Job.run == sj.restart_count) if sj.restart_count is not None
                           else same.order_by(col(Job.run).desc())).first()
        if job is not None:
            res.had_record += 1
            if job.record_source == "live" and sj.end is not None and time.time() - sj.end > LIVE_QUIET_S:
                finish_live(job)  # ended an hour ago and its final record never came
            if not job.enriched and job.record_source != "live":
                note_moved(session.connection(), [apply_sacct(job, sj)])
                note_cancel(session, job, sj)
                session.commit()
                res.enriched += 1
            return
        for rec in backfill_records(sj, cluster):
            job = ingest_record(session, rec)
        assert job is not None
        job.record_source = "backfill"
        apply_sacct(job, sj)
        note_cancel(session, job, sj)
        session.commit()
    res.created += 1
    res.created_ids.append(sj.job_id_text)


def backfill_records(sj: SacctJob, cluster: str) -> list[dict[str, Any]]:
    """Allocation-only spool records (record.py schema) for a GPU job that has none, one per node. GPUs are
    spread evenly over the nodes when they divide, else all on the first node; their indexes are positions
    (0..n-1), because accounting does not keep Slurm's GPU indexes."""
    nodes = sj.nodes or ["unknown"]
    if sj.gpu_count % len(nodes):
        nodes = nodes[:1]
    per = max(1, sj.gpu_count // len(nodes))
    why = f"{BACKFILL_REASON}: {sj.gpu_count} GPU(s) in AllocTRES, GPU indexes unknown"
    return [{
        "schema": recmod.SCHEMA_VERSION, "cluster": cluster, "node": node, "job_id": sj.job_id,
        "array_job_id": sj.array_job_id, "array_task_id": sj.array_task_id,
        "het_job_id": sj.het_job_id, "het_job_offset": sj.het_job_offset,
        "user": sj.user, "uid": sj.uid, "account": sj.account, "partition": sj.partition,
        "start_time": sj.start, "end_time": sj.end if sj.end is not None else sj.start,
        "exit_code": sj.exit_code, "signal": sj.signal, "backend": "none", "reason": why,
        "run": sj.restart_count or 0, "sluid": sj.sluid,
        "gpus": [recmod.empty_gpu(i, "none", why) for i in range(per)],
        "written_at": time.time(), "writer": BACKFILL_WRITER,
    } for node in nodes]
