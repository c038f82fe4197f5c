"""Merge node records into job and GPU rows: pure, no I/O (ingest's plan step).

Each node of a job writes its own record. :func:`merge` folds a batch of records, in spool order, into
the rows stored for their jobs (storage/writer.py stores the result), with rules that give the same
outcome whatever order a job's node records arrive in, and again when a record is ingested twice:

* job: earliest start, latest end, highest exit code and signal, union of nodes and reasons; identity
  fields (user, account, ...) from the records until sacct enrichment has run, which then owns them;
* a node's GPU rows are replaced by its latest record, keeping their ids (a replay updates in place);
* ``ingested_at`` is set once; ``analyzed_at`` is cleared so that the job's summary is recomputed, except
  by a running job's live record within ``LIVE_SUMMARY_AGE`` of its last analysis: a running job's stored
  summary (its line in ``-u``/``-A`` tables) is refreshed at most that often, not at every live record of
  every running job (its card, ``seff-gpu <id>``, is analysed on read from the latest record);
* a running job's ``live`` records make a row with ``record_source = "live"`` and state RUNNING, each
  snapshot replacing its node's GPU rows; the job's first final record drops every live GPU row and the
  row becomes a hook record; a live record arriving after that changes nothing;
* what was measured is never replaced by nothing: a final record's GPU that measured nothing (its node
  crashed and rebooted, so the Epilog found no Prolog state; the agent was down at the end) keeps the
  figures its node's live records had up to their last reading, with a note saying so, instead of an empty
  row; the time after that reading is nobody's figures, so no idle time is charged for it;
* a final record whose run the Epilog could not settle (``run_provisional``: no Prolog state) ends the run
  that is live on its node, when that run is the Epilog's restart count or one less (the rule the Epilog
  itself applies to a saved state, docs/DESIGN.md "Runs"): a crash and requeue then never leaves an ended
  run listed as running.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .. import record as recmod
from ..readmodel import GPU_COLUMNS, JOB_COLUMNS

Row = dict[str, Any]
Key = tuple[str, int, int]  # (cluster, job id, run): a job run's natural key
Spot = tuple[str, int]  # (node, GPU index): a GPU row's key within its job

# Which backend label a multi-node job gets: the most capable one that measured any of its GPUs.
_BACKEND_RANK = {"none": 0, "simulated": 1, "nvml": 2, "nvml-gpm": 3, "dcgm": 4}
# Per-GPU record fields copied as they are; the optional DCGM / MIG ones only where job_gpu has a column.
_GPU_FIELDS = ("minor", "memory_total_bytes", *recmod.FRACTIONS, "energy_j", "power_mean_w",
               *(f for f in recmod.OPTIONAL_GPU if f in GPU_COLUMNS))
_IDENTITY = (("array_job_id", None), ("array_task_id", None), ("het_job_id", None), ("het_job_offset", None),
             ("user", 128), ("uid", None), ("account", 128), ("partition", 128), ("sluid", 32))
# The tables' columns, as the read model names them (tests/test_readmodel.py holds the two equal), so that
# the node's live card merges a record without loading the models.
_JOB_COLS, _GPU_COLS = JOB_COLUMNS, GPU_COLUMNS
# The reason enrichment gives a live row whose node never sent the final record (storage/enrich.py); a final
# record that comes after all takes it away.
LIVE_ONLY = "no final record came from the node: figures up to the job's last live record"
START_FROM_LIVE = ": start time and figures from the node's last live record"  # in place of START_UNKNOWN
# How old a running job's stored summary may grow before a live record has it analysed again.
LIVE_SUMMARY_AGE = timedelta(minutes=15)
PROVISIONAL_SLACK = timedelta(seconds=300)  # node clocks: a live reading may seem this much after the Epilog


@dataclass
class Plan:
    """What a batch writes: the merged rows, and what was stored before the merge."""

    jobs: dict[Key, Row]  # merged job rows; "id" is None for a job not stored yet
    old_jobs: dict[Key, Row]  # the stored rows the merge started from
    gpus: dict[Key, dict[Spot, Row]]  # merged GPU rows; "id" is None for a new one
    old_gpu_ids: set[int]
    # (job, node) whose GPU rows a record replaced -> GPU index -> timeline points
    timelines: dict[tuple[Key, str], dict[int, list[Any]]]
    # stored GPU rows that a final record found unmeasured kept (their live figures): their timelines stay
    kept: set[int] = field(default_factory=set)

    def gpu_changes(self) -> tuple[list[Row], list[Row], list[int]]:
        """(new GPU rows, stored rows to rewrite: those of touched nodes, ids of stored rows now gone).
        Every row gets its job's id as ``job_pk``: the jobs' ids must be known."""
        inserts: list[Row] = []
        updates: list[Row] = []
        kept: set[int] = set()
        for key, rows in self.gpus.items():
            for row in rows.values():
                row["job_pk"] = self.jobs[key]["id"]
                if row.get("id") is None:
                    inserts.append(row)
                else:
                    kept.add(row["id"])
                    if (key, row["node"]) in self.timelines:
                        updates.append(row)
        return inserts, updates, sorted(self.old_gpu_ids - kept)

    def timeline_rows(self) -> list[Row]:
        """Timeline rows of the touched nodes' GPUs; the GPU rows' ids must be known."""
        out = []
        for key, rows in self.gpus.items():
            for (node, idx), row in rows.items():
                points = self.timelines.get((key, node), {}).get(idx)
                if points:
                    out.append({"job_gpu_id": row["id"], "points": points})
        return out


def job_key(rec: Row) -> Key:
    return (cut(rec["cluster"], 64), rec["job_id"], run_key(rec))


def run_key(rec: Row) -> int:
    """The record's ``job.run``: its run, or for a run the Epilog could not settle (``run_provisional``) a
    negative stand-in that enrichment replaces (docs/DESIGN.md, "Runs"): minus the run's start time, which
    every node of the run shares (SLURM_JOB_START_TIME), else minus its end time (a row per node until
    enrichment puts them together)."""
    if not rec.get("run_provisional"):
        return int(rec.get("run") or 0)
    return -int(rec.get("start_time") or rec["end_time"])


def merge(recs: list[Row], stored_jobs: dict[Key, Row], stored_gpus: dict[Key, dict[Spot, Row]],
          now: datetime) -> Plan:
    """Fold validated records, in order, into the stored rows of their jobs (which are left unchanged)."""
    jobs = {k: dict(v) for k, v in stored_jobs.items()}
    gpus: dict[Key, dict[Spot, Row]] = {job_key(r): {} for r in recs}
    gpus.update((k, {s: dict(r) for s, r in v.items()}) for k, v in stored_gpus.items())
    timelines: dict[tuple[Key, str], dict[int, list[Any]]] = {}
    kept: set[int] = set()
    for rec in recs:
        live = rec.get("live") is True
        key = (live_run_of(rec, jobs) if rec.get("run_provisional") and not live else None) or job_key(rec)
        job = jobs.get(key)
        if live and job is not None and job["record_source"] != "live":
            continue  # a running job's snapshot after its final record (or backfill): it changes nothing
        if job is None:  # not stored yet
            job = jobs[key] = dict.fromkeys(_JOB_COLS)
            job.update(cluster=key[0], job_id=key[1], run=key[2], record_source="live" if live else "hook",
                       gpu_count=0, backend="none", enriched=False)
        node = cut(rec["node"], 128)
        rows = gpus.setdefault(key, {})
        held = _fold(job, rows, rec, node, now)
        before = timelines.get((key, node), {})  # a kept row's points from a live record in this batch stay
        timelines[(key, node)] = {g["index"]: before.get(g["index"], []) if g["index"] in held
                                  else g.get("timeline") or [] for g in rec["gpus"]}
        kept |= {i for idx in held if (i := rows[(node, idx)].get("id")) is not None}
    old_ids = {r["id"] for rows in stored_gpus.values() for r in rows.values()}
    return Plan(jobs, dict(stored_jobs), gpus, old_ids, timelines, kept)


def live_run_of(rec: Row, jobs: dict[Key, Row]) -> Key | None:
    """The running job's row that a provisional final record (``run_provisional``: an Epilog without the
    Prolog's state) ends: the job's live row on the record's node whose run is the Epilog's count or one less,
    with the same SLUID where both have one and its last reading not after the record's end. A node runs one
    run of a job at a time, and a live row exists only while its Prolog state did: the Epilog that found none
    ends that run. None when there is no such row (enrichment then settles the run from accounting)."""
    count = int(rec.get("run") or 0)
    node, end = cut(rec["node"], 128), utc(rec["end_time"])
    for run in (count, count - 1):
        key = (cut(rec["cluster"], 64), rec["job_id"], run)
        row = jobs.get(key)
        if row is None or row["record_source"] != "live" or node not in (row["nodelist"] or "").split(","):
            continue
        if rec.get("sluid") and row.get("sluid") and rec["sluid"] != row["sluid"]:
            continue
        if row["end_time"] is not None and end is not None and row["end_time"] > end + PROVISIONAL_SLACK:
            continue
        return key
    return None


def measured(get: Callable[[str], Any]) -> bool:
    """Whether a GPU (a record's entry or a stored row, read through ``get``) holds any measured figure."""
    return any(get(m) is not None for m in recmod.METRICS)


def kept_note(as_of: datetime | None) -> str:
    """What a GPU row kept from its live records says about the time after them (the card's Coverage line)."""
    when = f" at {as_of:%H:%M:%S} UTC" if as_of is not None else ""
    return (f"measured up to the last reading{when}; the record from the job's end measured nothing, so the "
            "time after that reading is not in these figures")


def keep_measured(row: Row) -> Row:
    """A stored GPU row kept in place of a final record's empty one: its figures, window and timeline stay,
    its coverage says up to when (:func:`kept_note`)."""
    window = dict(row.get("window") or {})
    note = kept_note(row.get("end_time"))
    old = window.get("break")
    window["break"] = note if not isinstance(old, str) or note in old else f"{old}; {note}"
    row["window"] = window
    return row


def _fold(job: Row, gpus: dict[Spot, Row], rec: Row, node: str, now: datetime) -> set[int]:
    """Apply one node record to the in-memory job and its GPU rows (the rules of the module doc); returns the
    GPU indexes whose earlier, measured rows were kept in place of the record's unmeasured entries."""
    final = rec.get("live") is not True
    live_rows: dict[int, Row] = {}  # this node's measured live rows, which its final record may keep
    if job["record_source"] == "backfill":  # the hook's record came after all (storage/enrich.py):
        job["record_source"], job["reason"] = "hook", None  # it replaces the allocation-only backfill,
        gpus.clear()  # whose GPU rows were placeholders (sacct keeps no GPU indexes)
    elif job["record_source"] == "live" and final:  # the job's first final record:
        live_rows = {k[1]: r for k, r in gpus.items() if k[0] == node}
        job.update(record_source="hook", reason=None, start_time=None, end_time=None, state=None)
        gpus.clear()  # every node's live rows go; each node's final record brings its own
    start, end = utc(rec.get("start_time")), utc(rec["end_time"])
    mine = {k[1]: r for k, r in gpus.items() if k[0] == node} if gpus else {}
    for idx in mine:
        del gpus[(node, idx)]
    backend = rec["backend"]
    kept: set[int] = set()  # GPU indexes
    kept_start: datetime | None = None  # the kept rows' start: an Epilog without the Prolog's state knew none
    for g in rec["gpus"]:
        get = g.get
        before = mine.get(g["index"]) or live_rows.get(g["index"])
        if final and before is not None and not measured(get) and measured(before.get):
            mine.pop(g["index"], None)
            gpus[(node, g["index"])] = keep_measured(before)
            kept.add(g["index"])
            kept_start = _pick([kept_start, before["start_time"]], min)
            continue
        row = mine.pop(g["index"], None) or dict.fromkeys(_GPU_COLS)
        row.update(zip(_GPU_FIELDS, map(get, _GPU_FIELDS), strict=True))  # C-level copy of the fields
        row["node"], row["gpu_index"] = node, g["index"]
        peak = get("memory_used_peak_bytes")
        row["memory_used_peak_bytes"] = int(peak) if peak is not None else None
        row["uuid"] = cut(get("uuid"), 96)
        row["pci_bus_id"] = cut(get("pci_bus_id"), 32)
        row["model"] = cut(get("model"), 128)
        row["start_time"], row["end_time"] = start, end
        row["source"] = cut(get("source") or backend, 16)
        row["samples"] = get("samples") or 0
        row["missing"] = dict(get("missing") or {})
        gpus[(node, g["index"])] = row
    all_rows = sorted(gpus.values(), key=lambda r: (r["node"] == node, r.get("id") or 0))
    nodes = set(filter(None, (job["nodelist"] or "").split(","))) | {r["node"] for r in all_rows} | {node}
    job["nodelist"] = cut(",".join(sorted(nodes)), 1024)
    job["gpu_count"] = len(all_rows)
    models = sorted({r["model"] for r in all_rows if r["model"]})
    job["backend"] = max((r["source"] for r in all_rows), key=lambda s: _BACKEND_RANK.get(s, 0),
                         default=rec["backend"])
    if rec.get("reason") or (final and job["reason"] and LIVE_ONLY in job["reason"]):
        said = rec.get("reason") or ""
        if kept_start is not None:  # the job's own live rows knew the start the Epilog did not
            said = said.replace(recmod.START_UNKNOWN, START_FROM_LIVE)
        parts = set(filter(None, (job["reason"] or "").split("; "))) | set(said.split("; "))
        if final:
            parts.discard(LIVE_ONLY)  # the final record came after all
        job["reason"] = cut("; ".join(sorted(filter(None, parts))), 1024) or None
    for key, size in _IDENTITY:
        value = rec.get(key)
        if value is not None and (job[key] is None or not job["enriched"]):
            job[key] = cut(value, size) if size else value
    if not job["enriched"]:  # sacct enrichment owns these once it has run
        job["gpu_type"] = cut(", ".join(models), 128) if models else job["gpu_type"]
        job["start_time"] = _pick([job["start_time"], start, kept_start], min)
        job["end_time"] = _pick([job["end_time"], end], max)
        job["elapsed_s"] = ((job["end_time"] - job["start_time"]).total_seconds()
                            if job["start_time"] is not None and job["end_time"] is not None else None)
        job["exit_code"] = _pick([job["exit_code"], rec.get("exit_code")], max)
        job["signal"] = _pick([job["signal"], rec.get("signal")], max)
        job["state"] = "RUNNING" if job["record_source"] == "live" else _state(job["exit_code"], job["signal"])
    if job["ingested_at"] is None:
        job["ingested_at"] = now
    analyzed = job["analyzed_at"]
    if final or job["record_source"] != "live" or analyzed is None or now - analyzed >= LIVE_SUMMARY_AGE:
        job["analyzed_at"] = None  # new data: the stored summary (service/summarize.py) must be recomputed
    return kept


def utc(epoch: float | None) -> datetime | None:
    """Epoch seconds -> naive UTC datetime (how models.py stores every time)."""
    return None if epoch is None else datetime.fromtimestamp(float(epoch), UTC).replace(tzinfo=None)


def cut(value: Any, n: int) -> Any:
    return value[:n] if isinstance(value, str) else value


def _pick(values: list[Any], pick: Callable[[list[Any]], Any]) -> Any:
    known = [v for v in values if v is not None]
    return pick(known) if known else None


def _state(exit_code: int | None, signal: int | None) -> str | None:
    """COMPLETED / FAILED from the hook's view; None when unknown or signalled (sacct knows better)."""
    if exit_code is None or (exit_code == 0 and signal):
        return None
    return "COMPLETED" if exit_code == 0 else "FAILED"
