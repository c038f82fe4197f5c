"""A job's state between its Prolog and its Epilog: ``<state_dir>/jobs/<job_id>.json``.

``{"start": <collector start state>, "start_time", "gpus", "backend", "reason", "written_at", "writer"}``.
The Prolog writes it, the Epilog reads and removes it. Losing it costs the job's start time and its
start counters, never its record: :func:`load` says why it is missing or unusable, and the Epilog puts
that in the record's reason. Stdlib only (hook path).
"""

from __future__ import annotations

import json
import os

from . import spool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .config import Config


def path(cfg: Config, job_id: int) -> str:
    return os.path.join(cfg.paths.state_dir, "jobs", f"{int(job_id)}.json")


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
        return None, "no Prolog state for this job (the Prolog did not run, failed, or its state was lost)"
    except (OSError, ValueError) as exc:
        return None, f"Prolog state {state_path} unreadable ({exc})"
    if not isinstance(saved, dict):
        return None, f"Prolog state {state_path} is not a JSON object"
    st = saved.get("start_time")
    if not isinstance(st, int | float) or isinstance(st, bool) or not st > 0:
        saved["start_time"] = None
        return saved, f"Prolog state {state_path} has no valid start time"
    return saved, None


def gpus(saved: dict[str, Any]) -> list[int]:
    """The GPU indexes the Prolog saw (non-negative ints only: the file may have been edited)."""
    value = saved.get("gpus")
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
