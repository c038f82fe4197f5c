"""Running jobs' live records: the real Prolog and Epilog (subprocesses, as slurmd runs them), live.publish,
the real ingest into SQLite and the real seff-gpu. The GPUs are simulated (no GPU here); the nvml backend's
live figures are checked against its own Epilog figures on the agent's fake sampler in test_live_nvml.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hooksite import ROOT, HookSite
from sqlmodel import Session, select

from slurm_gpueff import live, record, spool
from slurm_gpueff.config import load
from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.rollups import refresh

T0 = 1_800_000_000.0
pytestmark = pytest.mark.process  # its tests start real processes (CLI commands, hooks, services)


# ``site``: a throwaway node (HookSite), the fixture in conftest.py


def _config(site: HookSite, db: str):
    text = Path(site.config_path).read_text().replace("[paths]\n", f'[paths]\ndatabase = "{db}"\n')
    with open(site.config_path, "w") as fh:
        fh.write(text)
    return load(site.config_path)


def _ingest(engine, site):
    res = ingest_spool(engine, site.spool)
    assert res.quarantined == 0 and res.failed == 0, res.errors
    summarize_pending(engine)
    return res


def _seff(site: HookSite, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUEFF_CONFIG=site.config_path, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def test_a_running_job_is_shown_so_far_and_its_final_record_replaces_it(site, tmp_path):
    db = str(tmp_path / "gpueff.db")
    cfg = _config(site, db)
    site.run("prolog", 77, GPUEFF_SIM_NOW=str(T0), SLURM_JOB_ACCOUNT="proj")
    saved = json.loads(Path(site.state_file(77)).read_text())
    assert saved["job"] == {"job_id": 77, "user": "alice", "uid": 1000, "account": "proj", "partition": "gpu",
                            "run": 0}
    assert saved["env"]["SLURM_JOB_GPUS"] == "0,1" and "GPUEFF_CONFIG" not in saved["env"]

    paths = live.publish(cfg, now=T0 + 600)
    assert [os.path.basename(p) for p in paths] == ["job-77-r0~live-node01.json"]
    rec = record.validate(json.loads(Path(paths[0]).read_text()))
    assert rec["live"] is True and rec["end_time"] == T0 + 600 and rec["exit_code"] is None
    assert all(g["energy_j"] == pytest.approx(g["power_mean_w"] * 600, rel=1e-3) for g in rec["gpus"])
    assert os.path.exists(site.state_file(77)), "a live record must leave the job's Prolog state"

    engine = make_engine(db)
    try:
        _ingest(engine, site)
        with Session(engine) as s:
            job = s.exec(select(Job).where(Job.job_id == 77)).one()
            assert (job.record_source, job.state, job.elapsed_s) == ("live", "RUNNING", 600.0)
        p = _seff(site, "77")
        assert p.returncode == 0, p.stderr
        assert "RUNNING (figures so far, as of 2027-01-15 08:10:00 UTC)" in p.stdout
        doc = json.loads(_seff(site, "77", "--json").stdout)["jobs"][0]["job"]
        assert (doc["state"], doc["running"], doc["as_of"]) == ("RUNNING", True, "2027-01-15T08:10:00Z")
        table = _seff(site, "-u", "alice", "-s", "running", "-S", "2027-01-01", "-E", "2027-02-01")
        assert table.returncode == 0 and "\n77 " in table.stdout and "RUNNING" in table.stdout, table.stdout
        assert "77" not in _seff(site, "-u", "alice", "-s", "COMPLETED", "-S", "2027-01-01",
                                 "-E", "2027-02-01").stdout.split("\n", 1)[1]

        # a second snapshot replaces the first: one row, its GPU rows updated in place
        live.publish(cfg, now=T0 + 1200)
        assert len(site.incoming()) == 1
        _ingest(engine, site)
        with Session(engine) as s:
            job = s.exec(select(Job).where(Job.job_id == 77)).one()
            gpus = s.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all()
            assert job.elapsed_s == 1200.0 and len(gpus) == 2
        # running jobs are not summed into the rollups until they end
        refresh(engine, full=True)
        with engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM usage_rollup").scalar() == 0

        # the final record replaces the live row; a snapshot taken just before the Epilog, arriving after
        # it, changes nothing
        late = live.publish(cfg, now=T0 + 1790)
        hold = str(tmp_path / "held.json")
        os.rename(late[0], hold)
        site.run("epilog", 77, GPUEFF_SIM_NOW=str(T0 + 1800))
        _ingest(engine, site)
        os.rename(hold, late[0])
        _ingest(engine, site)
        assert site.incoming() == []
        with Session(engine) as s:
            job = s.exec(select(Job).where(Job.job_id == 77)).one()
            assert (job.record_source, job.state, job.elapsed_s) == ("hook", "COMPLETED", 1800.0)
            assert len(s.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all()) == 2
        refresh(engine, full=True)
        with engine.begin() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM usage_rollup WHERE period = 'month'").scalar() == 1
        p = _seff(site, "77")
        assert p.returncode == 0 and "RUNNING" not in p.stdout
    finally:
        engine.dispose()


def test_a_multi_node_job_drops_every_live_row_at_its_first_final_record(site, tmp_path):
    """Node A's Epilog came, node B's not yet: the job shows A's final figures only, never a mix."""
    db = str(tmp_path / "gpueff.db")
    cfg = _config(site, db)
    engine = make_engine(db)
    try:
        for node in ("nodeA", "nodeB"):
            site.run("prolog", 90, GPUEFF_SIM_NOW=str(T0), SLURMD_NODENAME=node)
            live.publish(cfg, now=T0 + 300)
            os.unlink(site.state_file(90))  # one state dir serves both "nodes" here: the next Prolog writes it
        _ingest(engine, site)
        with Session(engine) as s:
            job = s.exec(select(Job).where(Job.job_id == 90)).one()
            assert job.record_source == "live" and job.gpu_count == 4 and job.nodelist == "nodeA,nodeB"
        site.run("prolog", 90, GPUEFF_SIM_NOW=str(T0), SLURMD_NODENAME="nodeA")
        site.run("epilog", 90, GPUEFF_SIM_NOW=str(T0 + 900), SLURMD_NODENAME="nodeA")
        _ingest(engine, site)
        with Session(engine) as s:
            job = s.exec(select(Job).where(Job.job_id == 90)).one()
            nodes = {g.node for g in s.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all()}
            assert job.record_source == "hook" and nodes == {"nodeA"} and job.state == "COMPLETED"
    finally:
        engine.dispose()


def test_live_names_never_collide_with_final_records():
    assert spool.record_name(5, "r0~live-x") != spool.record_name(5, "x", spool.live_tag({"run": 0}))
    assert spool.record_name(5, "x", spool.live_tag({"run": 2})) == "job-5-r2~live-x.json"
    with pytest.raises(record.RecordError, match="live must be a boolean"):
        record.validate({**_valid(), "live": "yes"})


def _valid():
    from hooksite import make_record

    return make_record(5)


def test_a_prolog_state_without_the_job_environment_gives_no_live_record(site, tmp_path):
    """States written by a Prolog of an earlier version hold no environment: skipped, not guessed."""
    cfg = _config(site, str(tmp_path / "x.db"))
    os.makedirs(os.path.join(site.state, "jobs"), exist_ok=True)
    with open(site.state_file(5), "w") as fh:
        json.dump({"start": {"backend": "simulated"}, "start_time": T0, "gpus": [0], "backend": "simulated"}, fh)
    with open(site.state_file(6), "w") as fh:
        fh.write("{broken")
    problems: list[str] = []
    assert live.publish(cfg, now=T0 + 60, log=problems.append) == []
    assert len(problems) == 1 and "6.json" in problems[0]


def test_gpueff_live_command_writes_the_records(site, tmp_path):
    _config(site, str(tmp_path / "x.db"))
    site.run("prolog", 31)
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", site.config_path, "live", "-v"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "job-31-r0~live-node01.json" in p.stdout and "1 live record(s) written" in p.stdout


def test_a_running_job_is_analysed_again_at_most_every_quarter_hour():
    """Every live record of every running job cleared the job's summary, so a site with 25,000 running jobs
    asked the service for 83 analyses a second, most of them of figures moved by five minutes. A live record
    within LIVE_SUMMARY_AGE of the job's last analysis keeps it; a later one, or the final record, has the
    job analysed again. (merge is pure: no database is needed to show the rule.)"""
    from datetime import timedelta

    import synthetic

    from slurm_gpueff.storage.merge import LIVE_SUMMARY_AGE, job_key, merge, utc

    rec = record.validate({**synthetic.record(501, gpus=2), "live": True, "exit_code": None, "signal": None})
    now = utc(rec["end_time"])
    first = merge([rec], {}, {}, now)
    key = job_key(rec)
    assert first.jobs[key]["analyzed_at"] is None and first.jobs[key]["record_source"] == "live"

    def again(analysed_ago: timedelta, later: dict) -> object:
        stored = {key: {**first.jobs[key], "id": 1, "analyzed_at": now - analysed_ago}}
        gpus = {key: {s: {**r, "id": i + 1} for i, (s, r) in enumerate(first.gpus[key].items())}}
        return merge([later], stored, gpus, now).jobs[key]["analyzed_at"]

    newer = {**rec, "end_time": rec["end_time"] + 300}
    assert again(timedelta(minutes=5), newer) == now - timedelta(minutes=5)  # kept: analysed 5 min ago
    assert again(LIVE_SUMMARY_AGE, newer) is None  # due again
    final = record.validate({**synthetic.record(501, gpus=2), "end_time": rec["end_time"] + 600})
    assert again(timedelta(minutes=1), final) is None  # the job ended: always analysed
