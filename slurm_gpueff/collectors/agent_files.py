"""Where the nvml node agent publishes, and how readers find their way in those files.

Shared by the agent (writer) and the hook-side collector (reader); kept apart from the agent so the
Prolog/Epilog import neither argparse nor signal handling nor threads. Stdlib only.
"""

from __future__ import annotations

import os
from typing import Any


def agent_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "agent")


def state_path(state_dir: str) -> str:
    return os.path.join(state_dir, "agent", "state.json")


def timeline_path(state_dir: str, uuid: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in uuid)
    return os.path.join(state_dir, "agent", "timeline", f"{safe}.jsonl")


def mig_key(parent_uuid: str, gi_id: int | str) -> str:
    """Name of a MIG slice's (GPU instance's) series: its timeline file is ``timeline_path(dir, mig_key(...))``."""
    return f"{parent_uuid}_gi{gi_id}"


def jobs_dir(state_dir: str) -> str:
    return os.path.join(state_dir, "jobs")


def job_file_uuids(data: Any) -> list[str]:
    """GPU UUIDs named in a Prolog job file: ``start.uuids`` (the collector's start state) or ``gpus``."""
    found: list[str] = []
    if isinstance(data, dict):
        start = data.get("start")
        cands: list[Any] = []
        if isinstance(start, dict) and isinstance(start.get("uuids"), list):
            cands += start["uuids"]
        for key in ("uuids", "gpus"):
            if isinstance(data.get(key), list):
                cands += data[key]
        for c in cands:
            if isinstance(c, str) and c.startswith(("GPU-", "MIG-")) and c not in found:
                found.append(c)
    return found


def line_time(line: str) -> float | None:
    """The ``t`` of a timeline line without parsing all of it (lines start with ``{"t":``)."""
    if not line.startswith('{"t":'):
        return None
    end = line.find(",", 5)
    try:
        return float(line[5:end])
    except ValueError:
        return None
