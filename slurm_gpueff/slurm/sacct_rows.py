"""One accounting record (:class:`SacctJob`) and the reading of ``sacct -P`` text into it.

``sacct -P`` is the same in every Slurm from 22.05 to 26.05 (checked on real 22.05.8, 24.11.5 and
26.05.5 daemons; captures in tests/data/sacct/<version>/), so it is the reference the JSON reader
(:mod:`.sacct_json`) must agree with, and the fallback where a version's JSON is wrong.

* ``-P`` has no ArrayJobID/HetJobID fields in 22.05: array and het ids come from ``JobID``
  (``6_1``, ``7+1``) next to ``JobIDRaw``. JobName may contain the delimiter, so it is the last field.
* State text may carry a suffix (``CANCELLED by 0``); only the first word is the state.
* GPU count comes from AllocTRES (what the job held), never ReqTRES (what it asked for): a job
  cancelled while pending has an empty AllocTRES.
* ``Restarts`` (which run of a requeued job a ``-D`` line is) exists from 23.02 on; 22.05 rejects it
  (``Invalid field requested: "Restarts"``), so it is asked for separately (:data:`RESTARTS_FIELDS`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from .hookenv import MAX_ID, parse_exit_text
from .jobid import is_digits

# The job fields asked of ``sacct -P``; JobName last because it may contain the delimiter.
PARSABLE_FIELDS = ("JobIDRaw", "JobID", "Cluster", "User", "UID", "Account", "Partition", "QOS", "NodeList",
                   "AllocTRES", "Submit", "Start", "End", "ElapsedRaw", "State", "ExitCode", "JobName")
RESTARTS_FIELDS = (*PARSABLE_FIELDS[:-1], "Restarts", "JobName")  # Slurm 23.02 and later
# States of a job that has not finished: its accounting record will still change.
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING", "COMPLETING",
                           "CONFIGURING", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT",
                           "STAGE_OUT", "SIGNALING", "STOPPED"})
# States of a job that has ended (sacct's codes BF, CA, CD, DL, F, NF, OOM, PR, TO).
FINAL_STATES = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY",
                          "PREEMPTED", "TIMEOUT"})
# The state a requeued run keeps in ``sacct -D``: the job goes on, but that run is over once it has an end.
REQUEUE_STATES = frozenset({"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD"})
_NONE_TEXT = {"", "None", "Unknown", "None assigned", "(null)"}


@dataclass
class SacctJob:
    """One job allocation (one run of it, with ``-D``) as Slurm accounting reports it.

    Times are epoch seconds (None = unknown)."""

    job_id: int                      # JobIDRaw: the key the hooks record
    job_id_text: str                 # as users see it: "6_1", "7+1", "12"
    cluster: str | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    job_name: str | None = None
    nodelist: str | None = None      # Slurm's compressed host list ("gpu[01-02]"), see expand_hostlist
    gpu_count: int = 0
    shards: int | None = None  # gres/shard: the job held shares of shared GPUs, not whole ones
    gpu_type: str | None = None
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    elapsed_s: float | None = None
    state: str | None = None         # first word of sacct's state ("CANCELLED by 0" -> "CANCELLED")
    state_text: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    alloc_tres: str | None = None
    source: str = "json"             # "json", "parsable" (which sacct output), or the demo's "simulated"
    notes: list[str] = field(default_factory=list)
    plugin: str | None = None        # the --json plugin that wrote it ("data_parser/v0.0.42"); None for -P
    restart_count: int | None = None  # sacct's restart_cnt / Restarts (None where this Slurm has neither)
    run: int | None = None           # 0, 1, ...: which run of the job this record is (set when runs were asked)
    sluid: str | None = None         # Slurm 26.05+: new per run, so (job_id, sluid) names one run
    array_throttle: int | None = None  # ``%N`` of an array, on its meta record only (JSON only)
    alloc_cpus: int | None = None    # the CPU side (sacct_steps.py): allocated CPUs, TotalCPU, largest MaxRSS
    total_cpu_s: float | None = None
    max_rss_bytes: int | None = None
    # who cancelled it, where accounting says: a uid ("CANCELLED by 0" in -P text) or a user name (the JSON's
    # kill_request_user; 22.05's JSON has none)
    cancelled_by: str | None = None

    @property
    def final(self) -> bool:
        return self.state is not None and self.state not in ACTIVE_STATES

    @property
    def run_over(self) -> bool:
        """This run is over: the job is final, or this run was requeued and has ended (``-D`` records)."""
        return self.final or (self.state in REQUEUE_STATES and self.end is not None)

    @property
    def nodes(self) -> list[str]:
        return expand_hostlist(self.nodelist)


def state_word(text: str | None) -> str | None:
    if not text:
        return None
    return text.split()[0].upper() or None


def cancelled_by(text: str | None) -> str | None:
    """The uid in ``CANCELLED by 1002`` (sacct -P's State), else None."""
    words = (text or "").split()
    if len(words) == 3 and words[0].upper() == "CANCELLED" and words[1] == "by" and is_digits(words[2]):
        return words[2]
    return None


def parse_tres(text: str | None) -> tuple[int, str | None]:
    """(GPU count, GPU type) from a TRES string like ``cpu=2,gres/gpu:h100=2,gres/gpu=2,node=1``.

    The untyped ``gres/gpu=N`` is the total; typed entries name the types (several joined by ``,``).
    Only typed entries (no total) happen when AccountingStorageTRES lists just typed GPUs: then sum.
    """
    total: int | None = None
    typed: dict[str, int] = {}
    for part in (text or "").split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key.startswith("gres/gpu"):
            continue
        count = to_int(value)  # memory-like TRES carry a unit suffix: not GPUs, not digits, ignored
        if count is None:
            continue
        if key == "gres/gpu":
            total = count
        elif key.startswith("gres/gpu:"):
            typed[key[len("gres/gpu:"):]] = count
    if total is None:
        total = sum(typed.values())
    types = [t for t, n in typed.items() if n > 0]
    return total, (",".join(sorted(types)) if types else None)


def parse_shards(text: str | None) -> int | None:
    """Shards of shared GPUs (``gres/shard``) in a TRES string: the untyped total, else the typed entries summed
    (``gres/shard:h100=3``, as 24.11+ name typed shards); None when the job held none."""
    total: int | None = None
    typed = 0
    for part in (text or "").split(","):
        key, sep, value = part.strip().partition("=")
        count = to_int(value) if sep else None
        if count is None:
            continue
        if key == "gres/shard":
            total = count
        elif key.startswith("gres/shard:"):
            typed += count
    total = total if total is not None else typed
    return total or None


def expand_hostlist(text: str | None) -> list[str]:
    """``"gpu[01-03,07],login1"`` -> ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]`` (Slurm's syntax).

    Only the bracket forms Slurm prints for node lists (one bracket group per name, ranges keep their
    zero padding). ``None assigned`` and empty text give an empty list.
    """
    if not text or text.strip() in _NONE_TEXT:
        return []
    out: list[str] = []
    for name in _split_top(text.strip()):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", name)
        if not m:
            out.append(name)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, sep, hi = r.partition("-")
            if sep and is_digits(lo) and is_digits(hi):
                width = len(lo)
                out.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(lo), int(hi) + 1))
            else:
                out.append(f"{prefix}{r}{suffix}")
    return out


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets (a comma inside one has a ``]`` ahead before any ``[``)."""
    return [p for p in re.split(r",(?![^\[]*\])", text) if p]


def ids_from_text(job: SacctJob) -> None:
    """Array / het ids from the display JobID (``6_1``, ``7+1``): all ``-P`` offers in 22.05."""
    m = re.fullmatch(r"(\d+)_(\d+)", job.job_id_text, re.ASCII)
    if m:
        job.array_job_id, job.array_task_id = int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"(\d+)\+(\d+)", job.job_id_text, re.ASCII)
    if m:
        job.het_job_id, job.het_job_offset = int(m.group(1)), int(m.group(2))


def epoch(value: object) -> float | None:
    """sacct times: epoch numbers (json; -P with SLURM_TIME_FORMAT=%s); 0 / Unknown / None -> None."""
    v = value if isinstance(value, float) else to_int(value)
    return float(v) if v is not None and v > 0 else None


def text_or_none(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return None if text in _NONE_TEXT else text


def to_int(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if is_digits(text) else None


def parse_parsable(text: str, delimiter: str = "|", fields: Sequence[str] = PARSABLE_FIELDS) -> list[SacctJob]:
    """Jobs from ``sacct -X -P -n --delimiter=D -o <fields>`` with ``SLURM_TIME_FORMAT=%s``.

    ``fields`` is :data:`PARSABLE_FIELDS` or :data:`RESTARTS_FIELDS` (JobName last in both)."""
    out = []
    n = len(fields)
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(delimiter)
        if len(cells) < n:
            continue  # not one of our lines (a warning sacct printed to stdout)
        cells = cells[: n - 1] + [delimiter.join(cells[n - 1:])]  # JobName may contain the delimiter
        row = dict(zip(fields, cells, strict=True))
        raw = to_int(row["JobIDRaw"])
        if raw is None:
            continue
        job = SacctJob(job_id=raw, job_id_text=row["JobID"].strip(), source="parsable")
        ids_from_text(job)
        job.cluster = text_or_none(row["Cluster"])
        job.user = text_or_none(row["User"])
        job.uid = to_int(row["UID"])
        job.account = text_or_none(row["Account"])
        job.partition = text_or_none(row["Partition"])
        job.qos = text_or_none(row["QOS"])
        job.job_name = row["JobName"]
        job.nodelist = text_or_none(row["NodeList"])
        job.alloc_tres = row["AllocTRES"].strip()
        job.gpu_count, job.gpu_type = parse_tres(job.alloc_tres)
        job.shards = parse_shards(job.alloc_tres)
        job.submit, job.start, job.end = epoch(row["Submit"]), epoch(row["Start"]), epoch(row["End"])
        elapsed = to_int(row["ElapsedRaw"])
        job.elapsed_s = float(elapsed) if elapsed is not None else None
        job.state_text = text_or_none(row["State"])
        job.state = state_word(job.state_text)
        job.cancelled_by = cancelled_by(job.state_text)
        job.exit_code, job.signal = parse_exit_text(row["ExitCode"].strip())
        job.restart_count = to_int(row.get("Restarts"))
        out.append(job)
    return out


def parse_exit_codes(text: str, delimiter: str = "|") -> dict[tuple[int, float | None], tuple[int | None, int | None]]:
    """``{(raw id, start): (exit, signal)}`` from ``sacct -X -P -n -o JobIDRaw,Start,ExitCode``
    (``SLURM_TIME_FORMAT=%s``); two-field lines (``JobIDRaw,ExitCode``) give ``(raw id, None)`` keys.

    The start tells apart the runs of a requeued job, which share the raw id."""
    out = {}
    for line in text.splitlines():
        cells = line.split(delimiter)
        if len(cells) in (2, 3) and is_digits(cells[0].strip()):
            start = epoch(cells[1]) if len(cells) == 3 else None
            out[(int(cells[0]), start)] = parse_exit_text(cells[-1].strip())
    return out


def number_runs(jobs: list[SacctJob]) -> list[SacctJob]:
    """Set :attr:`SacctJob.run` on every record: sacct's restart count where it has one, else the
    record's place among the same job's records by start (22.05 and data_parser v0.0.40/41 have none)."""
    by_id: dict[int, list[SacctJob]] = {}
    for j in jobs:
        by_id.setdefault(j.job_id, []).append(j)
    for runs in by_id.values():
        runs.sort(key=_run_order)
        for k, j in enumerate(runs):
            j.run = j.restart_count if j.restart_count is not None else k
    return jobs


def last_runs(jobs: list[SacctJob]) -> list[SacctJob]:
    """One record per raw job id, its latest run: 22.05's ``--json`` lists a requeued job's earlier runs
    even without ``-D``, where ``-P`` and later versions give only the last."""
    latest: dict[int, SacctJob] = {}
    for j in jobs:
        if j.job_id not in latest or _run_order(j) >= _run_order(latest[j.job_id]):
            latest[j.job_id] = j
    return [j for j in jobs if latest[j.job_id] is j]


def _run_order(j: SacctJob) -> tuple[int, bool, float]:
    """Runs in the order they ran; a run that never started (a requeued job's next run, pending or cancelled
    while it waited) is the last one, whatever its submit time says."""
    rc = j.restart_count if j.restart_count is not None else -1
    return rc, not j.start, j.start or j.submit or 0.0


def job_ids_of(text: str, delimiter: str = "|") -> dict[int, str]:
    """``{raw id: JobID}`` of the jobs in ``sacct -X -P -n -o JobIDRaw,JobID`` output (more fields after these
    two are ignored): ``-j 4`` of an array lists its tasks (``4_0``, ...), of a het job its components
    (``13+0``, ...). The record of an array's tasks not started yet (``4_[0-2]``, raw id 4, which is another
    task once it runs) names no job and is left out, as is any line whose raw id is not a Slurm job id."""
    out: dict[int, str] = {}
    for line in text.splitlines():
        cells = line.split(delimiter)
        raw = cells[0].strip()
        if len(cells) >= 2 and is_digits(raw) and len(raw) <= 10 and 0 < int(raw) <= MAX_ID \
                and "[" not in cells[1]:
            out[int(raw)] = cells[1].strip()
    return out


def raw_id_of(text: str, spec: str, delimiter: str = "|") -> int | None:
    """The raw id (JobIDRaw) of the job the user typed as ``spec`` (``4_0``, ``15+1``, ``12``) in
    ``sacct -X -P -n -o JobIDRaw,JobID`` output; None if absent."""
    spec = spec.strip()
    return next((raw for raw, job_id in job_ids_of(text, delimiter).items() if spec in (job_id, str(raw))), None)
