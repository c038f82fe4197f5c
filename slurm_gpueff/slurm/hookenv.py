"""What a Slurm hook learns about its job from the environment slurmd gives it.

slurmd runs Prolog/Epilog as root with a small, fixed environment (no PATH, no HOME): SLURM_JOB_ID,
SLURMD_NODENAME, SLURM_CLUSTER_NAME, SLURM_JOB_USER/UID, SLURM_JOB_ACCOUNT (absent when the job has
none), SLURM_JOB_PARTITION, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES; the Epilog adds
SLURM_JOB_EXIT_CODE2 (``"3:0"``) and SLURM_JOB_EXIT_CODE (a raw wait status: exit 3 -> 768).

Parsing never raises (a hook must run to the end whatever it is handed): each problem becomes a sentence
in :attr:`HookEnv.problems`, and so in the record's reason. Whatever is kept must also survive the rest of
the way: numbers are ASCII digits within the bounds Slurm (and the database's columns) give them, and text
is one printable line of bounded length (an undecodable byte or a control character would make ingest
refuse the record, or a log line two). Stdlib only (hook path).
"""

from __future__ import annotations

import os

from ..record import MAX_TIME

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Values of the GPU variables that mean "no GPU" rather than "a GPU we cannot read".
_NO_GPU_VALUES = ("", "NoDevFiles")

# Bounds: Slurm's ids and counts are 32-bit unsigned (0xfffffffe and up are its NO_VAL markers), uids too
# (-1 is "no uid"); an exit code is a byte; an epoch time must be a date the database can hold (record.MAX_TIME).
MAX_ID = 0xFFFFFFFD
MAX_UID = 0xFFFFFFFE
MAX_EXIT = 255
MAX_RESTARTS = 0xFFFF  # Slurm's restart_cnt is 16-bit
MAX_OFFSET = 0x7FFFFFFF  # het offsets: the database's 32-bit signed column
MAX_GPU_INDEX = 1023  # far beyond any node's GPU count: a larger "index" is junk, not a GPU
MAX_TEXT = 255  # user, account, partition and cluster names; Slurm's own limits are lower
MAX_NODE = 64  # HOST_NAME_MAX: the node name is part of the record's file name, which must fit NAME_MAX
_SHOWN = 64  # characters of a bad value echoed in a problem sentence


def clean_text(value: str, limit: int = MAX_TEXT) -> str:
    """One printable line of at most ``limit`` characters: each control, line-breaking or undecodable
    (surrogate) character becomes U+FFFD."""
    if not value.isprintable():
        value = "".join(c if c.isprintable() else "\ufffd" for c in value)
    return value[:limit]


def shown(value: str) -> str:
    """A raw value as a problem sentence quotes it: repr (escaped, one line), cut short."""
    return repr(value) if len(value) <= _SHOWN else f"{value[:_SHOWN]!r}... ({len(value)} characters)"


def number(text: str, maximum: int) -> int | None:
    """``text`` as a non-negative integer of ASCII digits up to ``maximum``, else None (never int()'s
    ValueError on other Unicode digits or on 4300+ digits)."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    return int(digits) if len(digits) <= len(str(maximum)) and int(digits) <= maximum else None


class HookEnv:
    """The job as the hook sees it. ``job_id`` is None when SLURM_JOB_ID is missing or not a job id."""

    job_id: int | None = None
    node = ""
    cluster: str | None = None
    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    gpu_var: str | None = None  # which variable the GPU list came from
    gpu_raw: str | None = None  # None: no GPUs allocated (a list we cannot parse, e.g. MIG UUIDs, is kept)
    exit_code: int | None = None
    signal: int | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    start_time: float | None = None  # SLURM_JOB_START_TIME where Slurm sets it (23.02+)
    end_time: float | None = None  # SLURM_JOB_END_TIME: the real end in an Epilog, the planned one in a Prolog
    # SLURM_JOB_RESTART_COUNT: in a Prolog this run's index; in an Epilog it may already count the requeue that
    # ended this run (one too high), so only the Prolog's saved value settles the run (docs/DESIGN.md, "Runs").
    restart_count: int | None = None
    sluid: str | None = None  # SLURM_JOB_SLUID (26.05+): new on every run, the same in its Prolog and Epilog

    def __init__(self) -> None:
        self.gpu_indexes: list[int] = []
        self.problems: list[str] = []


def _raw(env: Mapping[str, str], key: str) -> str | None:
    return (env.get(key) or "").strip() or None


def _text(env: Mapping[str, str], key: str, limit: int = MAX_TEXT) -> str | None:
    v = _raw(env, key)
    if v is None:
        return None
    return clean_text(v, limit).strip() or None


def _int(env: Mapping[str, str], key: str, problems: list[str], minimum: int = 0,
         maximum: int = MAX_ID) -> int | None:
    v = _raw(env, key)
    if v is None:
        return None
    n = number(v, maximum)
    if n is not None and n >= minimum:
        return n
    problems.append(f"{key}={shown(v)} is not an integer from {minimum} to {maximum}; ignored")
    return None


def parse_exit_text(text: str | None) -> tuple[int | None, int | None]:
    """``"3:0"`` (SLURM_JOB_EXIT_CODE2, sacct's ExitCode) -> (3, 0); anything else -> (None, None)."""
    code, sep, sig = (text or "").partition(":")
    code_n, sig_n = number(code, MAX_EXIT), number(sig, MAX_EXIT)
    if sep and code_n is not None and sig_n is not None:
        return code_n, sig_n
    return None, None


def parse_exit(env: Mapping[str, str], problems: list[str] | None = None) -> tuple[int | None, int | None]:
    """(exit_code, signal) of the job: SLURM_JOB_EXIT_CODE2 ``"3:0"`` first, else the raw wait status.

    The raw status is what waitpid() returned: exit code in bits 8-15, terminating signal in bits 0-6
    (768 -> exit 3; 9 -> killed by SIGKILL). Both None in the Prolog (the job has not run yet).
    """
    problems = problems if problems is not None else []
    v2 = _raw(env, "SLURM_JOB_EXIT_CODE2")
    if v2 is not None:
        code, sig = parse_exit_text(v2)
        if code is not None:
            return code, sig
        problems.append(f"SLURM_JOB_EXIT_CODE2={shown(v2)} is not 'exit:signal'")
    raw = _raw(env, "SLURM_JOB_EXIT_CODE")
    if raw is not None:
        status = number(raw, 0xFFFFFFFF)
        if status is not None:
            return (status >> 8) & 0xFF, status & 0x7F
        problems.append(f"SLURM_JOB_EXIT_CODE={shown(raw)} is not a wait status")
    return None, None


def parse_gpus(env: Mapping[str, str], problems: list[str]) -> tuple[list[int], str | None, str | None]:
    """(Slurm GPU indexes, sorted and unique; variable used; raw value) from SLURM_JOB_GPUS, else
    CUDA_VISIBLE_DEVICES. The raw value is None when the job has no GPUs at all. What cannot be read as an
    index or a MIG UUID (junk, a GRES name) gives no index, but the raw value is kept and ``problems`` says
    which GPUs were not measured and why: the record keeps the reason (a job whose list is all junk would
    otherwise just look as if it had no GPUs)."""
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = (env.get(var) or "").strip()
        if raw in _NO_GPU_VALUES:
            continue
        parts = [p.strip() for p in raw.split(",")]
        numbers = [number(p, MAX_GPU_INDEX) for p in parts]
        indexes = sorted({n for n in numbers if n is not None})
        bad = [p for p, n in zip(parts, numbers, strict=True) if n is None and not is_mig_uuid(p)]
        if bad:
            what = "the GPUs were" if len(bad) == len(parts) else f"{len(bad)} of its {len(parts)} GPUs were"
            problems.append(f"{var}={shown(raw)} could not be read as GPU indexes ({shown(bad[0])} is not an "
                            f"index from 0 to {MAX_GPU_INDEX} or a MIG UUID); {what} not measured")
        return indexes, var, clean_text(raw, 4096)
    return [], None, None


def is_mig_uuid(text: str) -> bool:
    """A MIG device UUID as the driver writes it: ``MIG-`` and printable ASCII with no spaces, at most 96
    characters (the record's limit)."""
    return text.startswith("MIG-") and len(text) <= 96 and text.isascii() and text.isprintable() \
        and " " not in text


def parse(env: Mapping[str, str]) -> HookEnv:
    """Read the hook environment; never raises (problems are collected in ``problems``)."""
    h = HookEnv()
    p = h.problems
    raw_id = env.get("SLURM_JOB_ID")
    job_id = number(raw_id.strip(), MAX_ID) if raw_id is not None else None
    if raw_id is None or not raw_id.strip():
        p.append("SLURM_JOB_ID is not set")
    elif job_id:
        h.job_id = job_id
    else:
        p.append(f"SLURM_JOB_ID={shown(raw_id)} is not a Slurm job id (1 to {MAX_ID})")
    h.node = _text(env, "SLURMD_NODENAME", MAX_NODE) or clean_text(os.uname().nodename.split(".")[0], MAX_NODE) \
        or "unknown"
    h.cluster = _text(env, "SLURM_CLUSTER_NAME")
    h.user = _text(env, "SLURM_JOB_USER")
    h.uid = _int(env, "SLURM_JOB_UID", p, maximum=MAX_UID)
    h.account = _text(env, "SLURM_JOB_ACCOUNT")
    h.partition = _text(env, "SLURM_JOB_PARTITION")
    h.gpu_indexes, h.gpu_var, h.gpu_raw = parse_gpus(env, p)
    h.exit_code, h.signal = parse_exit(env, p)
    # Only the controller's hooks see array/het ids; slurmd's see the raw id alone.
    h.array_job_id = _int(env, "SLURM_ARRAY_JOB_ID", p, 1)
    h.array_task_id = _int(env, "SLURM_ARRAY_TASK_ID", p)
    h.het_job_id = _int(env, "SLURM_HET_JOB_ID", p, 1)
    h.het_job_offset = _int(env, "SLURM_HET_JOB_OFFSET", p, maximum=MAX_OFFSET)
    start = _int(env, "SLURM_JOB_START_TIME", p, 1, MAX_TIME)
    h.start_time = float(start) if start else None
    end = _int(env, "SLURM_JOB_END_TIME", p, 1, MAX_TIME)
    h.end_time = float(end) if end else None
    h.restart_count = _int(env, "SLURM_JOB_RESTART_COUNT", p, maximum=MAX_RESTARTS)
    h.sluid = _text(env, "SLURM_JOB_SLUID", 32)
    return h


# The job's variables the Prolog keeps for live records (hookenv.parse and the collectors read these).
LIVE_ENV = frozenset(("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_CLUSTER_NAME", "SLURM_JOB_USER", "SLURM_JOB_UID",
                      "SLURM_JOB_ACCOUNT", "SLURM_JOB_PARTITION", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES",
                      "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_HET_JOB_ID", "SLURM_HET_JOB_OFFSET",
                      "SLURM_JOB_START_TIME", "SLURM_JOB_RESTART_COUNT", "SLURM_JOB_SLUID", "GPUEFF_SIM_PROFILE"))
