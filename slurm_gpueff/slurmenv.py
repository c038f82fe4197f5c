"""What a Slurm hook learns about its job from the environment slurmd gives it.

slurmd runs Prolog/Epilog as root with a small, fixed environment (no PATH, no HOME): SLURM_JOB_ID,
SLURMD_NODENAME, SLURM_CLUSTER_NAME, SLURM_JOB_USER/UID, SLURM_JOB_ACCOUNT (absent when the job has
none), SLURM_JOB_PARTITION, SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES; the Epilog adds
SLURM_JOB_EXIT_CODE2 (``"3:0"``) and SLURM_JOB_EXIT_CODE (a raw wait status: exit 3 -> 768).

Parsing never raises (a hook must run to the end whatever it is handed): each problem becomes a sentence
in :attr:`HookEnv.problems`, and so in the record's reason. Stdlib only (hook path).
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Values of the GPU variables that mean "no GPU" rather than "a GPU we cannot read".
_NO_GPU_VALUES = ("", "NoDevFiles")


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


def _text(env: Mapping[str, str], key: str) -> str | None:
    return (env.get(key) or "").strip() or None


def _int(env: Mapping[str, str], key: str, problems: list[str], minimum: int = 0) -> int | None:
    v = _text(env, key)
    if v is None:
        return None
    if v.isdigit() and int(v) >= minimum:
        return int(v)
    problems.append(f"{key}={v!r} is not an integer >= {minimum}; ignored")
    return None


def parse_exit_text(text: str | None) -> tuple[int | None, int | None]:
    """``"3:0"`` (SLURM_JOB_EXIT_CODE2, sacct's ExitCode) -> (3, 0); anything else -> (None, None)."""
    code, sep, sig = (text or "").partition(":")
    if sep and code.isdigit() and sig.isdigit():
        return int(code), int(sig)
    return None, None


def parse_exit(env: Mapping[str, str], problems: list[str] | None = None) -> tuple[int | None, int | None]:
    """(exit_code, signal) of the job: SLURM_JOB_EXIT_CODE2 ``"3:0"`` first, else the raw wait status.

    The raw status is what waitpid() returned: exit code in bits 8-15, terminating signal in bits 0-6
    (768 -> exit 3; 9 -> killed by SIGKILL). Both None in the Prolog (the job has not run yet).
    """
    problems = problems if problems is not None else []
    v2 = _text(env, "SLURM_JOB_EXIT_CODE2")
    if v2 is not None:
        code, sig = parse_exit_text(v2)
        if code is not None:
            return code, sig
        problems.append(f"SLURM_JOB_EXIT_CODE2={v2!r} is not 'exit:signal'")
    raw = _text(env, "SLURM_JOB_EXIT_CODE")
    if raw is not None:
        if raw.isdigit():
            status = int(raw)
            return (status >> 8) & 0xFF, status & 0x7F
        problems.append(f"SLURM_JOB_EXIT_CODE={raw!r} is not a wait status")
    return None, None


def parse_gpus(env: Mapping[str, str], problems: list[str]) -> tuple[list[int], str | None, str | None]:
    """(Slurm GPU indexes, sorted and unique; variable used; raw value) from SLURM_JOB_GPUS, else
    CUDA_VISIBLE_DEVICES. The raw value is None when the job has no GPUs at all. A value we cannot read (a
    MIG UUID, junk) gives no indexes but keeps the raw value, so the caller can still record the job and say why."""
    for var in ("SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"):
        raw = (env.get(var) or "").strip()
        if raw in _NO_GPU_VALUES:
            continue
        parts = [p.strip() for p in raw.split(",")]
        indexes = sorted({int(p) for p in parts if p.isdigit()})
        if not indexes and not all(p.startswith("MIG-") for p in parts):
            problems.append(f"{var}={raw!r} names no GPU index this version understands (MIG?)")
        return indexes, var, raw
    return [], None, None


def parse(env: Mapping[str, str]) -> HookEnv:
    """Read the hook environment; never raises (problems are collected in ``problems``)."""
    h = HookEnv()
    p = h.problems
    raw_id = env.get("SLURM_JOB_ID")
    if raw_id is None or not raw_id.strip():
        p.append("SLURM_JOB_ID is not set")
    elif raw_id.strip().isdigit() and int(raw_id) > 0:
        h.job_id = int(raw_id)
    else:
        p.append(f"SLURM_JOB_ID={raw_id!r} is not a Slurm job id")
    h.node = _text(env, "SLURMD_NODENAME") or os.uname().nodename.split(".")[0] or "unknown"
    h.cluster = _text(env, "SLURM_CLUSTER_NAME")
    h.user = _text(env, "SLURM_JOB_USER")
    h.uid = _int(env, "SLURM_JOB_UID", p)
    h.account = _text(env, "SLURM_JOB_ACCOUNT")
    h.partition = _text(env, "SLURM_JOB_PARTITION")
    h.gpu_indexes, h.gpu_var, h.gpu_raw = parse_gpus(env, p)
    h.exit_code, h.signal = parse_exit(env, p)
    # Only the controller's hooks see array/het ids; slurmd's see the raw id alone.
    h.array_job_id = _int(env, "SLURM_ARRAY_JOB_ID", p, 1)
    h.array_task_id = _int(env, "SLURM_ARRAY_TASK_ID", p)
    h.het_job_id = _int(env, "SLURM_HET_JOB_ID", p, 1)
    h.het_job_offset = _int(env, "SLURM_HET_JOB_OFFSET", p)
    start = _int(env, "SLURM_JOB_START_TIME", p, 1)
    h.start_time = float(start) if start else None
    end = _int(env, "SLURM_JOB_END_TIME", p, 1)
    h.end_time = float(end) if end else None
    h.restart_count = _int(env, "SLURM_JOB_RESTART_COUNT", p)
    sluid = _text(env, "SLURM_JOB_SLUID")
    h.sluid = sluid[:32] if sluid else None
    return h
