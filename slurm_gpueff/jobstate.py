"""A running job's saved state on its node: ``<state_dir>/jobs/<job_id>.json``, one per job.

The Prolog saves it (the collector's start state, the start time, the GPUs, who runs the job and the job's
environment for live records); the Epilog reads it and removes it once the final record is spooled. While it
exists the job runs on this node, so the same file tells the node agent which jobs to follow (per-job
/metrics, peak memory), ``gpueff live`` which jobs get live records, and ``seff-gpu`` that a job is still
running here. Every reader and writer of these files goes through this module. Stdlib only (hook path).

One per job, whatever the run: a requeued job stays COMPLETING until its Epilogs have finished, so the next
run's Prolog comes after them. Losing it costs the job's start time and start counters, never its record:
:func:`load` says why.
"""

from __future__ import annotations

import json
import os

from . import spool, statedir

TYPE_CHECKING = False  # typing, for annotations only, would slow every Prolog/Epilog's start-up
if TYPE_CHECKING:
    from typing import Any

NO_STATE = "no Prolog state for this job (the Prolog did not run, failed, or its state was lost)"


def exists(state_dir: str, job_id: int) -> bool:
    """Whether job ``job_id`` runs on this node (its Prolog's state is here)."""
    return os.path.exists(statedir.job(state_dir, job_id))


def save(state_path: str, saved: dict[str, Any]) -> None:
    """Write the state atomically (0600 in a 0700 directory); raises OSError. A collector start state
    that JSON cannot hold is dropped, and its ``reason`` says so."""
    try:
        data = json.dumps(saved, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        why = f"collector start state not storable: {exc}"
        saved.update(start=None, reason=f"{saved['reason']}; {why}" if saved.get("reason") else why)
        data = json.dumps(saved).encode()
    os.makedirs(os.path.dirname(state_path), mode=0o700, exist_ok=True)
    spool.atomic_write(state_path, data)


def load(state_path: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the saved state, None), else (what is left of it or None, why it is missing or unusable)."""
    try:
        with open(state_path, "rb") as fh:
            saved = json.loads(fh.read())
    except FileNotFoundError:
        return None, NO_STATE
    except (OSError, ValueError) as exc:
        return None, f"Prolog state {state_path} unreadable ({exc})"
    if not isinstance(saved, dict):
        return None, f"Prolog state {state_path} is not a JSON object"
    st = saved.get("start_time")
    if not isinstance(st, int | float) or isinstance(st, bool) or not st > 0:
        saved["start_time"] = None
        return saved, f"Prolog state {state_path} has no valid start time"
    return saved, None


def entries(state_dir: str) -> list[os.DirEntry[str]]:
    """The running jobs' state files as directory entries (for callers that cache by mtime), in no
    particular order; none when the folder does not exist yet. Raises OSError when it cannot be listed."""
    try:
        listing = list(os.scandir(statedir.jobs(state_dir)))
    except FileNotFoundError:
        return []
    return [e for e in listing if job_id_of(e.name) is not None]


def job_id_of(name: str) -> str | None:
    """The job id of a state file's name (``<digits>.json``), else None (temp files, strays)."""
    stem = name[:-5] if name.endswith(".json") else ""
    return stem if stem.isdigit() and stem.isascii() else None


def running(state_dir: str) -> list[str]:
    """Paths of the states of the jobs running on this node, by job id; none when unreadable."""
    try:
        found = entries(state_dir)
    except OSError:
        return []
    return [e.path for e in sorted(found, key=lambda e: int(e.name[:-5]))]


def saved_gpus(saved: dict[str, Any]) -> list[int]:
    """The GPU indexes the Prolog saw (non-negative ints only: the file may have been edited)."""
    value = saved.get("gpus")
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def saved_uuids(saved: object) -> list[str]:
    """GPU and MIG UUIDs named in a state's ``start.uuids`` (the collector's start state)."""
    start = saved.get("start") if isinstance(saved, dict) else None
    uuids = start.get("uuids") if isinstance(start, dict) else None
    if not isinstance(uuids, list):
        return []
    return list(dict.fromkeys(u for u in uuids if isinstance(u, str) and u.startswith(("GPU-", "MIG-"))))
