"""Unsaved job and GPU rows (the read model, slurm_gpueff/readmodel.py) from one spool record, through ingest's
own merge step (:func:`slurm_gpueff.storage.merge.merge`), so a test analyses exactly what ingest would
store, as the node's live card makes them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slurm_gpueff.readmodel import GpuRow, JobRow, gpu_row, job_row
from slurm_gpueff.storage.merge import merge


def _merged(rec: dict[str, Any]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The job's and its GPUs' column values, as ingest's merge makes them for a new job."""
    plan = merge([rec], {}, {}, datetime.now(UTC).replace(tzinfo=None))
    [(key, row)] = plan.jobs.items()
    return row, list(plan.gpus[key].values())


def from_record(rec: dict[str, Any]) -> tuple[JobRow, list[GpuRow]]:
    row, gpus = _merged(rec)
    return job_row(row), [gpu_row(g) for g in gpus]


def models_from_record(rec: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The same rows as unsaved ORM objects (models.Job, models.JobGpu), for a test to store them."""
    from slurm_gpueff.models import Job, JobGpu

    row, gpus = _merged(rec)
    return (Job(**{k: v for k, v in row.items() if k != "id"}),
            [JobGpu(**{k: v for k, v in g.items() if k not in ("id", "job_pk")}) for g in gpus])


def gpu_of(**values: Any) -> GpuRow:
    """A GPU row from its columns' values as stored (``window`` and ``shared`` as their JSON objects)."""
    return gpu_row(values)


def rows_of_models(job: Any, gpus: Any = ()) -> tuple[JobRow, list[GpuRow]]:
    """The read model's rows of stored ORM objects (a test that read them through the session)."""
    from slurm_gpueff.readmodel import GPU_COLUMNS, JOB_COLUMNS

    return (job_row({c: getattr(job, c) for c in JOB_COLUMNS}),
            [gpu_row({c: getattr(g, c) for c in GPU_COLUMNS}) for g in gpus])
