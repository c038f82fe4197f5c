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


def ingest_beside_a_writer(engine, spool_dir: str, ref, stored_first: bool = True) -> dict:  # noqa: ANN001
    """Job 7: node n2 stored first (when ``stored_first``); another writer holds a transaction that adds node
    n1 while ingest takes node n0 from ``spool_dir``. Asserts that ingest waits for that commit and stores its
    record in one run; returns ingest's rows, after asserting they equal ``ref`` written record by record."""
    import random
    import threading

    import synthetic

    from slurm_gpueff import spool
    from slurm_gpueff.storage.ingest import ingest_spool
    from slurm_gpueff.storage.writer import transaction, write_records

    a, b, c = (synthetic.record(7, rng=random.Random(1), node=n, timeline_points=2) for n in ("n0", "n1", "n2"))
    before = [c] if stored_first else []
    for rec in before:
        with transaction(engine) as conn:
            write_records(conn, [rec])
    spool.write_record(spool_dir, a)
    out = []
    with transaction(engine) as conn:
        write_records(conn, [b])
        t = threading.Thread(target=lambda: out.append(ingest_spool(engine, spool_dir)))
        t.start()
        t.join(0.5)
        assert t.is_alive(), "ingest must wait for the other writer's commit"
    t.join(30)
    assert (out[0].ingested, out[0].failed) == (1, 0), out[0].errors
    for rec in (*before, b, a):
        with transaction(ref) as conn:
            write_records(conn, [rec])
    got = rows(engine)
    assert got == rows(ref)
    return got
