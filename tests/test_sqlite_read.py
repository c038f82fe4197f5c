"""seff-gpu's SQLite fast path (seff/sqlite_read.py) gives exactly the rows the ORM gives.

A real SQLite database is filled by real ingest (multi-node jobs, array tasks recorded by raw id and
enriched with their array ids, het components, pre-Hopper GPUs with reasons for what is missing, DCGM
extras), summarised, then every way of naming a job is looked up both ways and compared column by
column, card by card. The fast path must not import SQLAlchemy: that was the point of it.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import synthetic
from sqlmodel import Session

from slurm_gpueff import spool
from slurm_gpueff.analysis import assess, job_figures
from slurm_gpueff.config import Config
from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.render import dumps, render_card
from slurm_gpueff.seff import sqlite_read
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.slurm.jobid import parse
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.queries import find_jobs, job_gpus

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


SPECS = ["101", "105", "200", "200_1", "201", "202_2", "300", "300+1", "301", "400", "999", "200_7", "300+5"]


def orm_lookup(engine, spec: str, cluster: str | None = None):
    with Session(engine) as s:
        return [(j, job_gpus(s, j)) for j in find_jobs(s, parse(spec), cluster)]


def columns(row, model) -> dict:
    return {c.name: getattr(row, c.name) for c in model.__table__.columns}


@pytest.mark.parametrize("spec", SPECS)
def test_the_fast_path_returns_the_orm_rows(db, spec):
    path, engine = db
    want = orm_lookup(engine, spec)
    got = sqlite_read.lookup(path, parse(spec))
    assert [j.id for j, _ in got] == [j.id for j, _ in want]
    if spec not in ("999", "200_7", "300+5"):
        assert want, spec
    for (gj, gg), (wj, wg) in zip(got, want, strict=True):
        assert columns(gj, Job) == columns(wj, Job)
        assert [columns(g, JobGpu) for g in gg] == [columns(g, JobGpu) for g in wg]
        cfg = Config().analysis
        fig_g, fig_w = job_figures(gj, gg), job_figures(wj, wg)
        diag_g, diag_w = assess(fig_g, cfg), assess(fig_w, cfg)
        assert render_card(gj, fig_g, diag_g) == render_card(wj, fig_w, diag_w)
        assert dumps([(gj, fig_g, diag_g)]) == dumps([(wj, fig_w, diag_w)])


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
