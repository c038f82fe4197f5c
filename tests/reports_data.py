"""A small job database for the report tests: simulated jobs through the real spool, ingest and summarize.

The GPU figures come from the simulated collector (no GPU here); everything after it is the real code.
"""

from __future__ import annotations

import time
from typing import Any

from sites import ingest_records, sim_record
from sqlmodel import Session, col, select

from slurm_gpueff.config import Config
from slurm_gpueff.models import Job
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.slurm.sacct import SacctJob
from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.enrich import apply_sacct

EVIL_NAME = 'train<script>alert("x")</script>\r\nBcc: victim@evil.example'


def job_record(job_id: int, profile: str, *, user: str, account: str, gpus: int = 1, hours: float = 2.0,
               ended_ago_h: float = 1.0, now: float | None = None) -> dict[str, Any]:
    """The record of a job that ended ``ended_ago_h`` hours before ``now`` (default: the time now)."""
    end = (time.time() if now is None else now) - ended_ago_h * 3600.0
    return sim_record(job_id, profile, gpus, hours, start=end - hours * 3600.0, end=end, cluster="c", node="gpu-n1",
                      user=user, account=account)


def make_db(tmp_path: Any, jobs: list[dict[str, Any]], names: dict[int, str] | None = None,  # type: ignore[no-untyped-def]
            url: str | None = None, enriched: bool = True):
    """Engine of a fresh database (SQLite in tmp_path, or ``url``) holding ``jobs`` (kwargs of
    :func:`job_record`), analysed; ``enriched``: as enrichment leaves them once sacct reported each job
    COMPLETED 0:0 (what accounting says of these jobs), else hook records only."""
    if url:
        engine = make_engine(url, create=False)
        migrate.upgrade(engine)  # the service host's `gpueff db upgrade`
    else:
        engine = make_engine(str(tmp_path / "jobs.db"))
    spool_dir = str(tmp_path / ("spool-pg" if url else "spool"))
    result = ingest_records(engine, spool_dir, (job_record(**j) for j in jobs))
    assert result.ingested == len(jobs), result.errors
    if enriched:
        enrich(engine, {j["job_id"]: "COMPLETED" for j in jobs})
    summarize_pending(engine)
    if names:
        with Session(engine) as s:
            for job in s.exec(select(Job)).all():
                if job.job_id in names:
                    job.job_name = names[job.job_id]
                    s.add(job)
            s.commit()
    return engine


def enrich(engine: Any, states: dict[int, str]) -> None:
    """Write what sacct reports (``states``: raw job id -> final state, exit 0:0) as enrichment does."""
    with Session(engine) as s:
        for job in s.exec(select(Job).where(col(Job.job_id).in_(list(states)))).all():
            apply_sacct(job, SacctJob(job_id=job.job_id, job_id_text=str(job.job_id), state=states[job.job_id],
                                      exit_code=0, signal=0))
            s.add(job)
        s.commit()


def config(tmp_path: Any, leads: dict[str, list[str]] | None = None, **reports: Any) -> Config:
    """A config whose reports go to tmp_path/reports; ``reports`` overrides [reports] keys, ``leads`` is [leads]."""
    data = {"site": {"cluster": "c"}, "paths": {"database": str(tmp_path / "jobs.db")},
            "reports": {"dir": str(tmp_path / "reports"), **reports},
            "mail": {"backoff_s": 0.0, "timeout_s": 5.0}, "leads": leads or {}}
    return Config(data)
