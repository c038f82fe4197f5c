"""Which job rows a user's job id names: the rules, once, for the ORM and the SQLite reader (stdlib only).

- ``123``: the job whose raw id (JobIDRaw) is 123. If that job is itself the array job or het leader
  123 (its ``array_job_id`` or ``het_job_id`` is 123), the id names the whole group, as in ``sacct -j``,
  so every task / component is returned. With no raw match: every task of array 123, else every
  component of het job 123.
- ``123_4``: array task 4 of array 123 (``array_job_id = 123``), or the row with raw id 123 whose
  ``array_task_id`` is 4 (a record that lacks the array id).
- ``123+1``: component 1 of het job 123 (``het_job_id = 123``), or the row with raw id 123 whose
  ``het_job_offset`` is 1.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

Cond = tuple[str, int]  # (job column, value): column == value
_CHUNK = 400  # raw ids per query: with the cluster, below SQLite's smallest limit of bound variables (999)
ORDER = ("cluster", "array_task_id", "het_job_offset", "job_id", "run")  # a requeued job's runs together
# run(any_of, all_of): the rows (job columns as attributes) where at least one ``any_of`` and every
# ``all_of`` equality holds, in ORDER; storage/queries.py and seff/sqlite_read.py each supply one.
Run = Callable[[Sequence[Cond], Sequence[Cond]], list[Any]]


class RawIds(NamedTuple):
    """Jobs named by their raw ids alone: the tasks or components accounting listed for an id whose records
    do not carry their array or het ids yet."""

    ids: tuple[int, ...]


def find(spec: Any, run: Run) -> list[Any]:
    """Rows matching a parsed job id (:class:`slurm_gpueff.slurm.jobid.JobSpec`) or :class:`RawIds`; empty
    list when none."""
    if isinstance(spec, RawIds):
        return [row for i in range(0, len(spec.ids), _CHUNK)
                for row in run([("job_id", raw) for raw in spec.ids[i:i + _CHUNK]], [])]
    j = spec.job
    if spec.task is not None:
        return run([("array_job_id", j), ("job_id", j)], [("array_task_id", spec.task)])
    if spec.het_offset is not None:
        return run([("het_job_id", j), ("job_id", j)], [("het_job_offset", spec.het_offset)])
    raw = run([("job_id", j)], [])
    groups = [r for r in raw if r.array_job_id == j or r.het_job_id == j]
    if raw and not groups:
        return raw
    found = run([("job_id", j), ("array_job_id", j), ("het_job_id", j)], [])
    if raw:
        return found
    array = [r for r in found if r.array_job_id == j]
    return array or [r for r in found if r.het_job_id == j]


def run_order(job: Any) -> tuple[Any, ...]:
    """A job's runs by end time (a run still without one last), then run number: the card's run is the last."""
    return (job.end_time is not None, job.end_time or 0, job.run)
