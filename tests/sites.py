"""One builder for the tests' sites: a finished job's record as the simulated collector measures it, its rows
stored as ingest would store them (or put through the real spool and ingest), and a job database with the config
that points seff-gpu at it.

The hook tests' site (a throwaway node: config, spool and state dirs, hooks run like slurmd) is
``hooksite.HookSite``, given to every test as the ``site`` fixture (tests/conftest.py); a module whose tests need
a job database overrides ``site`` with :func:`job_site`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from record_rows import models_from_record
from sqlalchemy.engine import Engine
from sqlmodel import Session

from slurm_gpueff import spool
from slurm_gpueff.collectors.base import JobContext
from slurm_gpueff.collectors.simulated import SimulatedCollector
from slurm_gpueff.config import Config
from slurm_gpueff.models import JobGpuTimeline
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import IngestResult, ingest_spool

START = 1_740_000_000.0
NO_GPM = "GPU has no GPM (pre-Hopper)"


def sim_record(job_id: int, profile: str = "bf16-healthy", gpus: int = 1, hours: float = 1.0, *,
               start: float = START, end: float | None = None, cluster: str = "demo", node: str = "gpu-node01",
               user: str = "alice", account: str = "vision", partition: str = "gpu", **extra: Any) -> dict[str, Any]:
    """The spool record of a finished job whose GPUs the simulated collector measured (``GPUEFF_SIM_PROFILE``
    ``profile``); ``extra`` adds or replaces record keys (uid, array and het ids, backend, reason...)."""
    end = start + hours * 3600 if end is None else end
    job = JobContext(job_id, node, cluster, list(range(gpus)), start_time=start, end_time=end,
                     env={"GPUEFF_SIM_PROFILE": profile})
    col = SimulatedCollector(Config())
    meas = col.stop(job, col.start(job))
    rec = {"schema": 1, "cluster": cluster, "node": node, "job_id": job_id, "start_time": start, "end_time": end,
           "backend": meas.backend, "reason": meas.reason, "gpus": meas.gpus, "user": user, "account": account,
           "partition": partition, "exit_code": 0, "signal": 0}
    rec.update(extra)
    return rec


def store(session: Session, rec: dict[str, Any], state: str | None = "COMPLETED", timeline: bool = False) -> None:
    """The record's job and GPU rows as ingest's merge makes them; ``state``: the one enrichment wrote (None:
    a hook record only, not enriched); with ``timeline``, each GPU's timeline row as ingest writes it."""
    job, gpus = models_from_record(rec)
    job.state = state
    job.enriched = state is not None
    session.add(job)
    session.flush()
    points = {g["index"]: g["timeline"] for g in rec["gpus"]}
    for g in gpus:
        g.job_pk = job.id
        session.add(g)
        if timeline:
            session.flush()
            session.add(JobGpuTimeline(job_gpu_id=g.id, points=points[g.gpu_index]))


def site_config(root: Path, database: Path | str, *, cluster: str | None = "demo", extra: str = "",
                name: str = "gpueff.toml") -> Path:
    """``root``/``name``: the database (a Path: that SQLite file; a str: the value as written, a URL or a path),
    state dir ``root``/run, spool dir ``root``/spool, then ``extra`` (more ``[paths]`` keys, then more TOML
    sections); a ``[site]`` cluster unless ``cluster`` is None."""
    cfg = root / name
    head = f'[site]\ncluster = "{cluster}"\n' if cluster is not None else ""
    value = f"sqlite:///{database}" if isinstance(database, Path) else database
    cfg.write_text(f'{head}[paths]\ndatabase = "{value}"\nstate_dir = "{root}/run"\n'
                   f'spool_dir = "{root}/spool"\n{extra}')
    return cfg


def spool_records(spool_dir: Path | str, records: Iterable[dict[str, Any]]) -> None:
    """The records in the spool as the Epilog leaves them (``spool.write_record``)."""
    for rec in records:
        spool.write_record(str(spool_dir), rec)


def ingest_records(engine: Engine, spool_dir: Path | str, records: Iterable[dict[str, Any]]) -> IngestResult:
    """The records through the real spool and ingest (``ingest_spool``) into ``engine``'s database."""
    spool_records(spool_dir, records)
    return ingest_spool(engine, str(spool_dir))


def job_site(root: Path, fill: Callable[[Session], None], **config: Any) -> tuple[Path, Path]:
    """A site with a job database: ``fill(session)`` stores its rows (see :func:`store`) in ``root``/gpueff.db;
    ``root``/run/jobs is the node's (empty) Prolog state. Returns (root, config path); ``config``: see
    :func:`site_config`."""
    db = root / "gpueff.db"
    engine = make_engine(str(db))
    try:
        with Session(engine) as s:
            fill(s)
            s.commit()
    finally:
        engine.dispose()
    (root / "run" / "jobs").mkdir(parents=True)
    return root, site_config(root, db, **config)
