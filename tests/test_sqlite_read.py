"""seff-gpu's SQLite fast path (seff/sqlite_read.py) and the SQLAlchemy path (storage/queries.py) make equal
read-model rows (readmodel.py), on SQLite and on PostgreSQL.

A real SQLite database is filled by real ingest (multi-node jobs, array tasks recorded by raw id and
enriched with their array ids, het components, pre-Hopper GPUs with reasons for what is missing, DCGM
extras, a shared GPU with its window), summarised, then every way of naming a job is looked up both ways and
the rows compared whole (frozen dataclasses: every field), against the ORM objects' columns too, card by
card. The same history copied into a real PostgreSQL (`gpueff db copy`'s code) gives the same rows through the
SQLAlchemy path. The fast path must not import SQLAlchemy: that was the point of it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import synthetic
from pgutil import pg_url  # noqa: F401  (fixture)
from record_rows import rows_of_models
from sqlmodel import Session, select

from slurm_gpueff import spool
from slurm_gpueff.analysis import assess, job_figures
from slurm_gpueff.config import Config
from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.readmodel import Shared, Window
from slurm_gpueff.render import dumps, render_card
from slurm_gpueff.seff import sqlite_read
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.slurm.jobid import parse
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.dbcopy import copy_database
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.queries import find_jobs, gpu_timelines, job_gpus

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    d = tmp_path_factory.mktemp("fast")
    path = str(d / "gpueff.db")
    engine = make_engine(path)
    rng = random.Random(5)
    recs = []
    for i in range(40):
        recs.append(synthetic.record(100 + i % 30, rng=rng, node=f"n{i // 30}", timeline_points=3))  # 100-109: 2 nodes
    for task, raw in enumerate((200, 201, 202)):  # array 200: tasks 0-2, raw ids 200-202
        recs.append(synthetic.record(raw, rng=rng, gpus=1, timeline_points=2) | {"array_job_id": 200,
                                                                                   "array_task_id": task})
    for off, raw in enumerate((300, 301)):  # het job 300: components +0 and +1
        recs.append(synthetic.record(raw, rng=rng, gpus=2, timeline_points=2) | {"het_job_id": 300,
                                                                                   "het_job_offset": off})
    shared = synthetic.record(500, rng=rng, gpus=1)
    shared["gpus"][0].update(window_s=3600.0, measured_s=3500.0, window={
        "start": 1.7e9, "end": 1.7e9 + 3600, "start_offset_s": 0.0, "end_offset_s": 2.5, "start_exact": True,
        "end_exact": False, "gaps": [[1.7e9 + 100, 1.7e9 + 200, "agent not running"]], "break": None}, shared={
        "with": ["501", "502"], "with_count": 3, "method": "split by NVML's per-process SM utilization",
        "share": 0.5, "shared_s": 1800.0, "unmeasured_s": 0.0, "unattributed": 0.01, "gpu_kernel_active": 0.9})
    recs.append(shared)
    dcgm = synthetic.record(400, rng=rng, gpus=1)
    dcgm["gpus"][0].update(xid_errors=1, throttle_s={"power": 2.5}, processes=[4242], mig_uuid="MIG-x",
                           mig_profile="1g.10gb")
    recs.append(dcgm)
    for rec in recs:
        spool.write_record(str(d / "spool"), rec)
    assert ingest_spool(engine, str(d / "spool")).ingested == len({(r["job_id"], r["node"]) for r in recs})
    summarize_pending(engine, Config().analysis)
    with engine.begin() as conn:  # an enriched row too (booleans, submit time, QOS)
        conn.exec_driver_sql("UPDATE job SET enriched = 1, qos = 'normal', submit_time = start_time WHERE job_id = 101")
    yield path, engine
    engine.dispose()


SPECS = ["101", "105", "200", "200_1", "201", "202_2", "300", "300+1", "301", "400", "500", "999", "200_7",
         "300+5"]


def orm_lookup(engine, spec: str, cluster: str | None = None):
    with Session(engine) as s:
        return [(j, job_gpus(s, j)) for j in find_jobs(s, parse(spec), cluster)]


def model_rows(engine, job_pk: int):
    """The ORM objects' columns of one job, made into read-model rows: what SQLModel itself loads."""
    with Session(engine) as s:
        job = s.get(Job, job_pk)
        return rows_of_models(job, s.exec(select(JobGpu).where(JobGpu.job_pk == job_pk)
                                          .order_by(JobGpu.node, JobGpu.gpu_index)).all())


@pytest.mark.parametrize("spec", SPECS)
def test_the_fast_path_returns_the_orm_rows(db, spec):
    path, engine = db
    want = orm_lookup(engine, spec)
    got = sqlite_read.lookup(path, parse(spec))
    assert [j.id for j, _ in got] == [j.id for j, _ in want]
    if spec not in ("999", "200_7", "300+5"):
        assert want, spec
    for (gj, gg), (wj, wg) in zip(got, want, strict=True):
        assert gj == wj and gg == wg  # every field of every row
        assert (gj, gg) == model_rows(engine, gj.id)
        cfg = Config().analysis
        fig_g, fig_w = job_figures(gj, gg), job_figures(wj, wg)
        diag_g, diag_w = assess(fig_g, cfg), assess(fig_w, cfg)
        assert render_card(gj, fig_g, diag_g) == render_card(wj, fig_w, diag_w)
        assert dumps([(gj, fig_g, diag_g)]) == dumps([(wj, fig_w, diag_w)])


def test_the_shared_gpu_and_its_window_are_typed_once(db):
    path, _engine = db
    ((job, (gpu,)),) = sqlite_read.lookup(path, parse("500"))
    assert gpu.shared == Shared(others=("501", "502"), with_count=3,
                                method="split by NVML's per-process SM utilization", share=0.5, shared_s=1800.0,
                                unmeasured_s=0.0, unattributed=0.01, gpu_kernel_active=0.9)
    assert gpu.window == Window(start=1.7e9, end=1.7e9 + 3600, start_offset_s=0.0, end_offset_s=2.5,
                                start_exact=True, end_exact=False,
                                gaps=((1.7e9 + 100, 1.7e9 + 200, "agent not running"),))
    fig = job_figures(job, [gpu])
    assert "with jobs 501, 502 and 1 more" in render_card(job, fig, assess(fig))


@pytest.mark.postgres
def test_postgresql_gives_the_same_rows(db, pg_url):  # noqa: F811
    """The SQLite history copied into PostgreSQL: the SQLAlchemy path there gives the fast path's rows here,
    every field (times, booleans, JSON) alike, and the same cards and JSON."""
    path, engine = db
    pg = make_engine(pg_url, create=False)
    try:
        copy_database(engine, pg, replace=True)
        for spec in SPECS:
            here, there = sqlite_read.lookup(path, parse(spec)), orm_lookup(pg, spec)
            assert here == there, spec
            for (job, gpus), (pjob, pgpus) in zip(here, there, strict=True):
                fig, pfig = job_figures(job, gpus), job_figures(pjob, pgpus)
                assert dumps([(job, fig, assess(fig))]) == dumps([(pjob, pfig, assess(pfig))])
        with Session(pg) as s:
            ids = [g.id for g in job_gpus(s, find_jobs(s, parse("101"))[0])]
            assert gpu_timelines(s, job_gpus(s, find_jobs(s, parse("101"))[0])) == sqlite_read.timelines(path, ids)
    finally:
        pg.dispose()


def test_cluster_filter_and_types(db):
    path, engine = db
    assert sqlite_read.lookup(path, parse("101"), "elsewhere") == []
    ((job, gpus),) = sqlite_read.lookup(path, parse("101"), "synth")
    assert {g.node for g in gpus} == {"n0", "n1"} and job.nodelist == "n0,n1"  # a two-node job
    assert job.enriched is True and job.submit_time is not None and job.submit_time.tzinfo is None
    ((dj, dg),) = sqlite_read.lookup(path, parse("400"))
    assert dg[0].throttle_s == {"power": 2.5} and dg[0].processes == [4242] and dg[0].mig_profile == "1g.10gb"


@pytest.mark.process
def test_seff_gpu_jobid_on_sqlite_does_not_import_sqlalchemy(db, tmp_path):
    path, _engine = db
    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[paths]\ndatabase = "{path}"\nstate_dir = "{tmp_path}/state"\n[privacy]\nenabled = false\n')
    code = ("import sys; from slurm_gpueff.cli.seff import main; rc = main(['--config', sys.argv[1], '200_1']); "
            "print('RC', rc, 'sqlalchemy' in sys.modules, 'sqlmodel' in sys.modules)")
    p = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=60)
    assert "Job ID: 200_1 (raw id 201)" in p.stdout, (p.stdout, p.stderr)
    assert p.stdout.strip().splitlines()[-1] == "RC 0 False False", p.stdout


def test_a_file_that_is_not_a_gpueff_database_is_a_clear_error(tmp_path):
    import sqlite3

    bad = tmp_path / "other.db"
    sqlite3.connect(bad).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(sqlite3.OperationalError, match="no such table: job"):
        sqlite_read.lookup(str(bad), parse("1"))
