"""Unsaved Job/JobGpu rows from one spool record, through ingest's own merge step
(:func:`slurm_gpueff.storage.merge.merge`), so a test analyses or stores exactly what ingest would."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.storage.merge import merge


def from_record(rec: dict[str, Any]) -> tuple[Job, list[JobGpu]]:
    plan = merge([rec], {}, {}, datetime.now(UTC).replace(tzinfo=None))
    [(key, row)] = plan.jobs.items()
    job = Job(**{k: v for k, v in row.items() if k != "id"})
    gpus = [JobGpu(**{k: v for k, v in g.items() if k not in ("id", "job_pk")}) for g in plan.gpus[key].values()]
    return job, gpus
