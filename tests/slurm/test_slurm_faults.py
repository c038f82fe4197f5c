"""Faults under a real slurmd: the collector broken, the spool unwritable, the database locked.

Every job must still complete, the node must stay ``idle`` (a failing Prolog/Epilog would drain it),
and the job's record must reach the database once the fault is gone. GPUs simulated (conftest.py).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time

import pytest

from .conftest import ROOT, SlurmCluster

pytestmark = pytest.mark.slurm
ECHO = "echo GPUS=$SLURM_JOB_GPUS; sleep 1"


def run_job(c: SlurmCluster, gpus: int = 1) -> int:
    j = c.sbatch(f"--gres=gpu:{gpus}", "--wrap", ECHO)
    assert c.wait_state([j])[j] == "COMPLETED"
    assert c.wait_node_idle() == "idle", c.idle_wait_log
    assert "Reason=" not in c.node_reason()
    return j


@pytest.fixture
def cluster(slurm: SlurmCluster):
    yield slurm
    slurm.write_config()  # every fault test leaves the normal config behind


def test_collector_broken_nvml_backend_without_agent(cluster):
    c = cluster
    c.write_config(backend="nvml")  # the node agent is not running (stopped / never started)
    j = run_job(c, 2)
    assert "ingested 1," in c.gpueff("ingest").stdout
    r = c.job_row(j)
    assert r["gpu_count"] == 2 and "gpueff agent not running" in r["reason"], dict(r)
    figures = c.rows("SELECT g.kernel_active, g.sm_active FROM job_gpu g JOIN job j ON j.id = g.job_pk "
                     "WHERE j.job_id = ?", (j,))
    assert [tuple(f) for f in figures] == [(None, None), (None, None)]  # unmeasured is None, never 0
    assert c.gpu_indexes(j) == c.job_gpus_seen(j)
    c.write_config()  # fault gone: the next job is measured again
    j2 = run_job(c)
    c.gpueff("ingest")
    assert c.job_row(j2)["backend"] == "simulated"


def test_spool_unwritable(cluster):
    c = cluster
    aside = c.spool + ".aside"
    os.rename(c.spool, aside)
    with open(c.spool, "w") as fh:  # a file where the spool directory should be: root cannot write there either
        fh.write("not a directory\n")
    try:
        j = run_job(c)
        fallback = os.path.join(c.state, "spool-fallback", "incoming")
        assert os.listdir(fallback) == [f"job-{j}-{c.node}.json"]
    finally:
        os.unlink(c.spool)
        os.rename(aside, c.spool)
    # fault gone: the next Epilog on the node moves the stranded record back; ingest takes both
    j2 = run_job(c)
    assert {f"job-{j}-{c.node}.json", f"job-{j2}-{c.node}.json"} <= set(c.spool_files())
    assert "ingested 2," in c.gpueff("ingest").stdout
    assert c.job_row(j)["gpu_count"] == 1 and c.job_row(j2)["gpu_count"] == 1
    assert c.gpu_indexes(j) == c.job_gpus_seen(j)


def test_database_locked(cluster):
    c = cluster
    lock = sqlite3.connect(c.db_path, timeout=1)
    lock.execute("BEGIN EXCLUSIVE")  # another writer holds the database
    try:
        j = run_job(c)
        ingest = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", c.config_path,
                                   "ingest"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  env=dict(c.env, PYTHONPATH=ROOT), cwd=c.out)
        time.sleep(2.0)
        assert ingest.poll() is None  # waiting on the lock, not failing the records
        assert f"job-{j}-{c.node}.json" in c.spool_files() and c.job_row(j) is None
    finally:
        lock.rollback()
        lock.close()
    out, err = ingest.communicate(timeout=60)
    assert ingest.returncode == 0 and "ingested 1," in out, (out, err)
    assert c.job_row(j)["gpu_count"] == 1 and c.spool_files() == []


def test_database_unavailable_keeps_records_in_the_spool(cluster):
    """The database cannot be opened at all: ingest fails clearly, the records wait in the spool."""
    c = cluster
    db_dir = os.path.dirname(c.db_path)
    aside = db_dir + ".aside"
    shutil.move(db_dir, aside)
    with open(db_dir, "w") as fh:
        fh.write("not a directory\n")
    try:
        j = run_job(c)
        p = c.gpueff("ingest", check=False)
        assert p.returncode == 1 and f"job-{j}-{c.node}.json" in c.spool_files(), (p.stdout, p.stderr)
    finally:
        os.unlink(db_dir)
        shutil.move(aside, db_dir)
    assert "ingested 1," in c.gpueff("ingest").stdout and c.job_row(j) is not None
