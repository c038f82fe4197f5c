"""Where the nvml node agent publishes, and how readers find their way in those files.

The published files as a contract between their one writer (:mod:`slurm_gpueff.node.agent`) and their readers
on the hook path (the nvml and dcgm collectors, MIG resolution): their names and how to read them, with none of
the agent's process, signals or threads.
"""

from __future__ import annotations

import json

from .. import statedir
from .integrals import timeline_points

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any


def read_state(state_dir: str) -> dict[str, Any]:
    """The agent's published state; empty when it is missing, unreadable or not an object."""
    try:
        with open(statedir.agent_state(state_dir), "rb") as fh:
            state = json.loads(fh.read())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def mig_key(parent_uuid: str, gi_id: int | str) -> str:
    """Name of a MIG slice's (GPU instance's) series: its timeline file is ``statedir.timeline(dir, mig_key(...))``."""
    return f"{parent_uuid}_gi{gi_id}"


def line_time(line: str) -> float | None:
    """The ``t`` of a timeline line without parsing all of it (lines start with ``{"t":``)."""
    if not line.startswith('{"t":'):
        return None
    end = line.find(",", 5)
    try:
        return float(line[5:end])
    except ValueError:
        return None


def read_job_timeline(state_dir: str, key: str, match: Mapping[str, object], job_start: float | None,
                      start_state: Mapping[str, Any], snap: Mapping[str, Any], state: Mapping[str, Any],
                      end: Mapping[str, Any]) -> list[list[float | None]]:
    """A job's coarse timeline: ``key``'s timeline lines between the Prolog's snapshot ``snap`` and the Epilog's
    ``end``, differenced into per-interval means ([] when either end's time is unknown). Only lines carrying
    ``match`` (the agent ``instance``; for a MIG slice also its ``gen``) count: counters of another agent run or
    slice generation are never mixed in."""
    t_start = start_state.get("updated") or start_state.get("t")
    t_end = state.get("updated")
    if not isinstance(t_start, int | float) or not isinstance(t_end, int | float):
        return []
    points: list[tuple[float, Mapping[str, Any]]] = [(t_start, snap)]
    try:
        with open(statedir.timeline(state_dir, key)) as fh:
            for line in fh:
                t = line_time(line)
                if t is None or not t_start < t < t_end:
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if all(rec.get(k) == v for k, v in match.items()):
                    points.append((t, rec))
    except OSError:
        pass
    points.append((t_end, end))
    return timeline_points(points, job_start or t_start)
