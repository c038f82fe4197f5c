"""The spool record: one JSON object per (job, node), written by the Epilog and read by ingest.

Plain dicts, stdlib only (hook path). Unknown figures are ``None`` with the reason in the GPU's
``missing`` map (docs/DESIGN.md, "Unknown is never zero"). Schema (version 1)::

    {"schema": 1, "cluster": str, "node": str, "job_id": int,
     "array_job_id": int|null, "array_task_id": int|null, "het_job_id": int|null, "het_job_offset": int|null,
     "user": str|null, "uid": int|null, "account": str|null, "partition": str|null,
     "start_time": float epoch s|null (null: unknown, Prolog state lost), "end_time": float epoch s,
     "exit_code": int|null, "signal": int|null, "backend": BACKENDS, "reason": str|null,
     "gpus": [GPU...], "written_at": float, "writer": "slurm-gpueff 0.1.0",
     "run": int|null (absent or null: 0), "run_provisional": bool (absent: false), "sluid": str|null,
     "live": bool (absent: false)}

    ``live`` marks a running job's figures so far (collectors' ``peek``, slurm_gpueff/live.py): its
    ``end_time`` is when they were read, it has no exit code, and the job's final record replaces it.

    ``run`` is the run of a requeued job (its restart count when the run started); ``run_provisional``
    marks one the Epilog could not settle without the Prolog's state, and enrichment settles it
    (docs/DESIGN.md, "Runs"); ``sluid`` is Slurm's id of the run (26.05+). Records without them are run 0.

    GPU = {"index": int (Slurm's index), "minor": int|null, "uuid": str|null, "pci_bus_id": str|null,
           "model": str|null, "memory_total_bytes": int|null, <METRICS>..., "samples": int,
           "source": str, "missing": {metric: reason}, "timeline": [[t_offset_s, k, s, t], ...]}
"""

from __future__ import annotations

import json
import math

from .errors import RecordError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeGuard

START_UNKNOWN = ": start time unknown"  # how a record's reason says its start is unknown (an Epilog without
# the Prolog's state); where the job's own live rows supply the start, ingest says so instead (storage/merge.py)
SCHEMA_VERSION = 1

# Time-weighted mean fractions in [0, 1]; then other per-GPU measurements (non-negative numbers).
FRACTIONS = ("kernel_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active",
             "fp32_active", "fp16_active", "hmma_active", "imma_active", "dfma_active")
QUANTITIES = ("memory_used_peak_bytes", "energy_j", "power_mean_w")
METRICS = FRACTIONS + QUANTITIES

BACKENDS = ("nvml-gpm", "nvml", "dcgm", "simulated", "none")

# Optional per-GPU fields (absent or null when unknown). DCGM job statistics: XID error count,
# seconds the clocks were held back per cause (power, thermal, reliability, board_limit,
# low_utilization, sync_boost), compute PIDs seen. MIG: the slice a job held; ``uuid`` is then the
# parent GPU's UUID and ``memory_total_bytes`` the slice's memory.
# Where the backend knows them: ``window_s``, the seconds from the reading at job start to the one at job
# end; ``measured_s``, the part of it with readings (less when the agent was down); ``window``, how the
# window was taken (WINDOW_KEYS; docs/FIGURES.md "The job's window").
OPTIONAL_INTS = ("xid_errors", "mig_gi_id", "mig_ci_id")
OPTIONAL_STRS = ("mig_uuid", "mig_profile")
OPTIONAL_SECONDS = ("window_s", "measured_s")
OPTIONAL_GPU = OPTIONAL_INTS + OPTIONAL_STRS + OPTIONAL_SECONDS + ("throttle_s", "processes", "window", "shared")
# shared = {"with": [job id, ...] (at most MAX_WITH), "with_count": int, "method": str, "share": fraction|null
# (the time-weighted 1/n of the GPU the job held), "shared_s": seconds held with other jobs, "unattributed":
# fraction|null (of the GPU's kernel time, what no job's process accounted for), "unmeasured_s": seconds no
# job's part could be measured (MPS), "gpu_kernel_active": fraction|null (the whole GPU's kernel activity over
# the window, every job's)}: the GPU was shared during
# the job, and its figures are the job's own part (collectors/nvml.py, node/attribution.py).
MAX_WITH = 64  # other jobs named per job and GPU (a GPU split among more is rare; with_count stays exact)
# window = {"start": epoch, "end": epoch (the readings' times), "start_offset_s", "end_offset_s": seconds the
# reading was taken before the Prolog / Epilog (0 for an immediate reading), "start_exact", "end_exact": bool
# (a reading taken on the hook's request), "gaps": [[from, to, why], ...] (agent down), "break": str|null
# (why continuity was lost: reboot, GPU reset)}; all optional.
WINDOW_NUMBERS = ("start", "end", "start_offset_s", "end_offset_s")
WINDOW_BOOLS = ("start_exact", "end_exact")
MAX_GAPS = 64  # the agent keeps its latest this many (node/resume.py), a job's window too

_NUMBER = frozenset((int, float))  # exact classes: bool (an int subclass) is refused
# What the database's columns hold (a record beyond them would fail its whole batch, again at every ingest,
# instead of going to quarantine): 64-bit ids and byte counts, 32-bit counts and codes, dates before 10000.
INT64 = 2**63 - 1
INT32 = 2**31 - 1
MAX_TIME = 253402300799  # 9999-12-31T23:59:59Z: the latest time the database can hold
_INT32_JOB = ("het_job_offset", "exit_code", "signal", "run")
_INT32_GPU = ("index", "minor", "samples", "xid_errors", "mig_gi_id", "mig_ci_id")
_QUANTITIES = (*QUANTITIES, "memory_total_bytes")
_JOB_INTS = ("job_id", "array_job_id", "array_task_id", "het_job_id", "het_job_offset", "uid", "exit_code",
             "signal", "run")
_JOB_STRS = ("cluster", "node", "user", "account", "partition", "reason", "writer", "sluid")


def _is_number(v: object) -> TypeGuard[int | float]:
    return v.__class__ in _NUMBER


def empty_gpu(index: int, source: str, reason: str | None = None, **ident: Any) -> dict[str, Any]:
    """A GPU entry with nothing measured; every metric None with the same reason."""
    return {"index": index, "minor": None, "uuid": None, "pci_bus_id": None, "model": None,
            "memory_total_bytes": None, **ident, **dict.fromkeys(METRICS), "samples": 0, "source": source,
            "missing": dict.fromkeys(METRICS, reason) if reason else {}, "timeline": []}


def validate(rec: object) -> dict[str, Any]:
    """Check a record read from the spool; raise RecordError naming the first problem (ingest quarantines it)."""
    if not isinstance(rec, dict):
        raise RecordError(f"record is a {type(rec).__name__}, expected a JSON object")
    if rec.get("schema") != SCHEMA_VERSION:
        raise RecordError(f"unsupported schema {rec.get('schema')!r} (this version reads {SCHEMA_VERSION})")
    for key in ("cluster", "node", "job_id", "start_time", "end_time", "backend", "gpus"):
        if key not in rec:
            raise RecordError(f"missing required field {key!r}")
    for key in _JOB_INTS:
        v = rec.get(key)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool)):
            raise RecordError(f"{key} must be an integer or null, got {v!r}")
        if v is not None and abs(v) > (INT32 if key in _INT32_JOB else INT64):
            raise RecordError(f"{key} = {v} is beyond what the database holds")
    if rec["job_id"] is None or rec["job_id"] <= 0:
        raise RecordError(f"job_id must be a positive integer, got {rec['job_id']!r}")
    for key in _JOB_STRS:
        v = rec.get(key)
        if v is not None and not isinstance(v, str):
            raise RecordError(f"{key} must be a string or null, got {v!r}")
    if (rec.get("run") or 0) < 0 or rec.get("run_provisional", False).__class__ is not bool:
        raise RecordError(f"run must be >= 0 and run_provisional a boolean, got {rec.get('run')!r}, "
                          f"{rec.get('run_provisional')!r}")
    if rec.get("live", False).__class__ is not bool:
        raise RecordError(f"live must be a boolean, got {rec.get('live')!r}")
    if not rec["cluster"] or not rec["node"]:
        raise RecordError("cluster and node must be non-empty")
    for key in ("start_time", "end_time"):
        v = rec[key]
        if v is None and key == "start_time":
            continue  # unknown: the Prolog's state was lost (the reason says so); never guessed
        if not isinstance(v, int | float) or isinstance(v, bool) or not 0 < v <= MAX_TIME:  # NaN fails too
            raise RecordError(f"{key} must be a positive epoch time before the year 10000, got {v!r}")
    if rec["start_time"] is not None and rec["end_time"] < rec["start_time"]:
        raise RecordError("end_time is before start_time")
    if rec["backend"] not in BACKENDS:
        raise RecordError(f"unknown backend {rec['backend']!r}")
    if not isinstance(rec["gpus"], list):
        raise RecordError("gpus must be a list")
    seen: set[int] = set()
    for i, gpu in enumerate(rec["gpus"]):
        _validate_gpu(i, gpu)
        if gpu["index"] in seen:
            raise RecordError(f"gpus[{i}]: duplicate GPU index {gpu['index']}")
        seen.add(gpu["index"])
    return rec


def _validate_gpu(i: int, gpu: object) -> None:
    where = f"gpus[{i}]"
    if not isinstance(gpu, dict):
        raise RecordError(f"{where} is not an object")
    idx = gpu.get("index")
    if not isinstance(idx, int) or isinstance(idx, bool) or idx < 0:
        raise RecordError(f"{where}.index must be a non-negative integer, got {idx!r}")
    # Exact type tests (bool is not a number here); a range test also rejects NaN and infinities.
    for m in FRACTIONS:
        v = gpu.get(m)
        if v is not None and (not _is_number(v) or not -1e-6 <= v <= 1 + 1e-6):
            raise RecordError(f"{where}.{m} must be a fraction in [0, 1] or null, got {v!r}")
    for m in _QUANTITIES:
        v = gpu.get(m)
        top = INT64 if m.endswith("_bytes") else math.inf
        if v is not None and (not _is_number(v) or not 0 <= v < math.inf or v > top):
            raise RecordError(f"{where}.{m} must be a non-negative number or null, got {v!r}")
    for k in _INT32_GPU:
        v = gpu.get(k)
        if v.__class__ is int and v > INT32:
            raise RecordError(f"{where}.{k} = {v} is beyond what the database holds")
    _validate_optional(where, gpu)
    samples = gpu.get("samples", 0)
    if not isinstance(samples, int) or samples < 0:
        raise RecordError(f"{where}.samples must be a non-negative integer")
    if not isinstance(gpu.get("missing", {}), dict):
        raise RecordError(f"{where}.missing must be an object")
    tl = gpu.get("timeline", [])
    if tl.__class__ is not list or not all(p.__class__ is list and len(p) == 4 for p in tl):
        raise RecordError(f"{where}.timeline must be a list of [t, kernel, sm, tensor] points")


def _validate_optional(where: str, gpu: dict[str, Any]) -> None:
    """The optional DCGM / MIG fields: absent or null, else well-typed (see OPTIONAL_GPU)."""
    for k in OPTIONAL_INTS:
        v = gpu.get(k)
        if v is not None and (v.__class__ is not int or v < 0):
            raise RecordError(f"{where}.{k} must be a non-negative integer or null, got {v!r}")
    for k, longest in zip(OPTIONAL_STRS, (96, 32), strict=True):
        v = gpu.get(k)
        if v is not None and (not isinstance(v, str) or len(v) > longest):
            raise RecordError(f"{where}.{k} must be a string of at most {longest} characters or null, got {v!r}")
    th = gpu.get("throttle_s")
    if th is not None and (not isinstance(th, dict) or any(
            not isinstance(k, str) or not isinstance(v, int | float) or isinstance(v, bool)
            or not math.isfinite(v) or v < 0 for k, v in th.items())):
        raise RecordError(f"{where}.throttle_s must map causes to non-negative seconds, got {th!r}")
    for k in OPTIONAL_SECONDS:
        v = gpu.get(k)
        if v is not None and (not _is_number(v) or not 0 <= v <= MAX_TIME):
            raise RecordError(f"{where}.{k} must be a non-negative number of seconds or null, got {v!r}")
    _validate_window(where, gpu.get("window"))
    _validate_shared(where, gpu.get("shared"))
    procs = gpu.get("processes")
    if procs is not None and (not isinstance(procs, list) or any(
            not isinstance(p, int) or isinstance(p, bool) or p <= 0 for p in procs)):
        raise RecordError(f"{where}.processes must be a list of process ids, got {procs!r}")


def _validate_shared(where: str, sh: object) -> None:
    if sh is None:
        return
    if not isinstance(sh, dict):
        raise RecordError(f"{where}.shared must be an object or null, got {sh!r}")
    others = sh.get("with", [])
    if others.__class__ is not list or len(others) > MAX_WITH or not all(
            isinstance(j, str) and j.isascii() and j.isdigit() and len(j) <= 20 for j in others):
        raise RecordError(f"{where}.shared.with must be a list of at most {MAX_WITH} job ids")
    n = sh.get("with_count", len(others))
    if n.__class__ is not int or not len(others) <= n <= INT32:
        raise RecordError(f"{where}.shared.with_count must be an integer of at least len(with), got {n!r}")
    method = sh.get("method")
    if method is not None and (not isinstance(method, str) or len(method) > 512):
        raise RecordError(f"{where}.shared.method must be a string of at most 512 characters or null")
    for k in ("share", "unattributed", "gpu_kernel_active"):
        v = sh.get(k)
        if v is not None and (not _is_number(v) or not 0 <= v <= 1 + 1e-6):
            raise RecordError(f"{where}.shared.{k} must be a fraction in [0, 1] or null, got {v!r}")
    for k in ("shared_s", "unmeasured_s"):
        v = sh.get(k)
        if v is not None and (not _is_number(v) or not 0 <= v <= MAX_TIME):
            raise RecordError(f"{where}.shared.{k} must be a non-negative number of seconds or null, got {v!r}")


def _validate_window(where: str, w: object) -> None:
    if w is None:
        return
    if not isinstance(w, dict):
        raise RecordError(f"{where}.window must be an object or null, got {w!r}")
    for k in WINDOW_NUMBERS:
        v = w.get(k)
        if v is not None and (not _is_number(v) or not -MAX_TIME <= v <= MAX_TIME):
            raise RecordError(f"{where}.window.{k} must be a number or null, got {v!r}")
    for k in WINDOW_BOOLS:
        if w.get(k) is not None and w[k].__class__ is not bool:
            raise RecordError(f"{where}.window.{k} must be a boolean or null, got {w[k]!r}")
    brk = w.get("break")
    if brk is not None and (not isinstance(brk, str) or len(brk) > 512):
        raise RecordError(f"{where}.window.break must be a string of at most 512 characters or null")
    gaps = w.get("gaps", [])
    if gaps.__class__ is not list or len(gaps) > MAX_GAPS or not all(
            g.__class__ is list and len(g) == 3 and _is_number(g[0]) and _is_number(g[1])
            and 0 <= g[0] <= g[1] <= MAX_TIME and isinstance(g[2], str) and len(g[2]) <= 256 for g in gaps):
        raise RecordError(f"{where}.window.gaps must be a list of at most {MAX_GAPS} [from, to, why] triples")


def encode(rec: dict[str, Any]) -> bytes:
    """A record's bytes in the spool: compact JSON. ValueError for NaN or infinity, TypeError for a value
    JSON cannot hold."""
    return json.dumps(rec, separators=(",", ":"), allow_nan=False).encode()


def serialise(rec: dict[str, Any]) -> tuple[bytes | None, str | None]:
    """(the bytes, None) for a record that validates and encodes, else (None, the problem), for a writer
    that must then record the job without the measurement that broke it."""
    try:
        validate(rec)
        return encode(rec), None
    except Exception as exc:  # noqa: BLE001 - RecordError, NaN in a timeline, unserialisable values
        return None, f"collector returned an invalid measurement ({exc}); GPU figures dropped"
