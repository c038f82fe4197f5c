"""Stored ingest rows by natural key, for tests that compare two databases (SQLite and PostgreSQL, one
ingest and a reference written record by record): ids and ingest times are left out, since the two
sides assign them differently."""

from __future__ import annotations

import json

from sqlalchemy import select

from slurm_gpueff.models import Job, JobGpu, JobGpuTimeline

SKIP = {"id", "job_pk", "job_gpu_id", "ingested_at"}


def rows(engine) -> dict:  # noqa: ANN001
    """{"job" | "job_gpu" | "timeline": {natural key: the row's other columns as sorted JSON}}."""
    out = {}
    with engine.connect() as conn:
        jobs = {r.id: (r.cluster, r.job_id) for r in conn.execute(select(Job.__table__))}
        gpus = {r.id: (jobs[r.job_pk], r.node, r.gpu_index) for r in conn.execute(select(JobGpu.__table__))}
        for name, table, key in (("job", Job.__table__, lambda r: jobs[r.id]),
                                 ("job_gpu", JobGpu.__table__, lambda r: gpus[r.id]),
                                 ("timeline", JobGpuTimeline.__table__, lambda r: gpus[r.job_gpu_id])):
            out[name] = {key(r): json.dumps({k: v for k, v in r._mapping.items() if k not in SKIP}, default=str,
                                            sort_keys=True)
                         for r in conn.execute(select(table))}
    return out
