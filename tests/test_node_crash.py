"""A job's node crashes mid-job: what was measured stays, nothing is invented, an ended run is never running.

The real Prolog and Epilog (subprocesses, as slurmd runs them), ``live.publish`` (what the agent runs), the
real ingest, summaries, enrichment and ``seff-gpu`` on SQLite. The crash is what a reboot leaves: the node's
state directory gone (its Prolog state with it), then the Epilog that Slurm runs when the node is back. The
GPUs are simulated (no GPU here); tests/slurm/test_slurm_crash.py does the same on real Slurm daemons.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from hooksite import ROOT, HookSite, make_record
from record_rows import rows_of_models
from sqlmodel import Session, select

from slurm_gpueff import live, record, spool
from slurm_gpueff.config import load
from slurm_gpueff.models import AlertLog, Job, JobGpu
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.slurm.sacct_json import parse_json
from slurm_gpueff.slurm.sacct_rows import SacctJob, cancelled_by, parse_parsable
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.enrich import enrich_jobs, match_run
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.writer import ingest_record

T0 = 1_800_000_000.0
BUSY_S = 81  # the job's last live reading, BUSY_S after its start; its node crashed after that
DAY = ("-S", "2027-01-01", "-E", "2027-02-01")


def _config(site: HookSite, db: str):
    text = Path(site.config_path).read_text().replace("[paths]\n", f'[paths]\ndatabase = "{db}"\n')
    Path(site.config_path).write_text(text)
    return load(site.config_path)


def _ingest(engine, site: HookSite) -> None:
    res = ingest_spool(engine, site.spool)
    assert res.quarantined == 0 and res.failed == 0, res.errors
    summarize_pending(engine)


def _seff(site: HookSite, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, GPUEFF_CONFIG=site.config_path, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", *args], capture_output=True, text=True,
                          env=env, timeout=60)


def _crash(site: HookSite, engine, job_id: int, **epilog_env: str) -> None:
    """The job runs and is measured live, then its node dies: the state directory is gone after the reboot,
    and the Epilog that Slurm runs once the node is back finds no Prolog state."""
    site.run("prolog", job_id, GPUEFF_SIM_NOW=str(T0), GPUEFF_SIM_PROFILE="bf16-healthy")
    live.publish(load(site.config_path), now=T0 + BUSY_S)
    _ingest(engine, site)
    with Session(engine) as s:
        assert s.exec(select(Job).where(Job.job_id == job_id)).one().record_source == "live"
    shutil.rmtree(site.state)  # a reboot: /run is a tmpfs
    p, _ = site.run("epilog", job_id, GPUEFF_SIM_NOW=str(T0 + 300), SLURM_JOB_EXIT_CODE2="0:9", **epilog_env)
    assert p.returncode == 0, p.stderr


@pytest.mark.process
@pytest.mark.parametrize("requeued", [False, True], ids=["node_fail", "node_fail_requeued"])
def test_a_crashed_node_keeps_the_live_figures_and_never_says_never_used(site, tmp_path, requeued):
    """The Epilog without the Prolog's state measures nothing (the simulated backend as a real one: no figure
    over a window nobody watched). Its record ends the run that was live on the node (requeued: the Epilog sees
    restart count 1 and cannot settle its run alone), the figures are the last live reading's over the measured
    81 s, GPU-hours and idle waste for those seconds only, the reason on the card; the run is no longer running
    anywhere: its card, ``--json``, ``seff-gpu -u`` and the running-jobs table."""
    db = str(tmp_path / "gpueff.db")
    _config(site, db)
    engine = make_engine(db)
    try:
        _crash(site, engine, 77, **({"SLURM_JOB_RESTART_COUNT": "1"} if requeued else {}))
        (path,) = site.incoming()
        rec = record.validate(json.loads(Path(path).read_text()))
        assert rec["run_provisional"] is requeued and rec["start_time"] is None
        assert all(g[m] is None for g in rec["gpus"] for m in record.METRICS), rec["gpus"]
        assert rec["reason"].startswith("no Prolog state for this job")
        _ingest(engine, site)
        with Session(engine) as s:
            (job,) = s.exec(select(Job).where(Job.job_id == 77)).all()  # one row: the live run's own
            gpus = s.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all()
        assert (job.run, job.record_source) == (0, "hook") and job.state != "RUNNING"
        assert "no Prolog state for this job" in job.reason and "start time unknown" not in job.reason
        assert "start time and figures from the node's last live record" in job.reason
        assert len(gpus) == 2 and all(g.kernel_active and g.kernel_active > 0.9 for g in gpus), gpus
        assert job.start_time == datetime.fromtimestamp(T0, UTC).replace(tzinfo=None)
        assert job.gpu_hours == pytest.approx(2 * BUSY_S / 3600)  # the measured seconds, not to the Epilog
        k = sum(g.kernel_active for g in gpus) / 2
        assert job.idle_gpu_hours == pytest.approx(2 * BUSY_S / 3600 * (1 - k))
        assert job.verdict != "never_used"

        card = _seff(site, "77")
        assert card.returncode == 0, card.stderr
        out = " ".join(card.stdout.split())
        assert "Kernel-active: 9" in out and "GPU never used" not in out and "RUNNING" not in out, card.stdout
        assert "Coverage: measured up to the last reading at 08:01:21 UTC; the record from the job's end " \
               "measured nothing" in out, card.stdout
        assert "Note: no Prolog state for this job" in out, card.stdout
        doc = json.loads(_seff(site, "77", "--json").stdout)["jobs"][0]
        assert doc["job"]["running"] is False and doc["job"]["state"] != "RUNNING"
        assert doc["job"]["reason"].startswith("no Prolog state") and doc["figures"]["kernel_active"]["value"] > 0.9
        table = _seff(site, "-u", "alice", *DAY)
        assert "\n77 " in table.stdout and "RUNNING" not in table.stdout, table.stdout
        running = _seff(site, "-u", "alice", "-s", "RUNNING", *DAY)
        assert "\n77 " not in running.stdout, running.stdout
    finally:
        engine.dispose()


@pytest.mark.process
def test_a_crash_before_any_live_reading_says_na_with_the_reason(site, tmp_path):
    """No live record reached the database (the node died before its first): nothing was measured, and the
    card says so with the reason: n/a, never 0 % and "GPU never used", no idle time charged."""
    db = str(tmp_path / "gpueff.db")
    _config(site, db)
    engine = make_engine(db)
    try:
        site.run("prolog", 78, GPUEFF_SIM_NOW=str(T0))
        shutil.rmtree(site.state)
        site.run("epilog", 78, GPUEFF_SIM_NOW=str(T0 + 300))
        _ingest(engine, site)
        with Session(engine) as s:
            job = s.exec(select(Job).where(Job.job_id == 78)).one()
        assert job.kernel_active is None and job.idle_gpu_hours is None and job.verdict is None
        out = " ".join(_seff(site, "78").stdout.split())
        assert "Kernel-active: n/a (no start state: the Prolog did not run or its saved state was lost)" in out
        assert "Verdict: GPU never used" not in out and "Note: no Prolog state for this job" in out, out
    finally:
        engine.dispose()


@pytest.mark.parametrize("version", ["22.05.8", "24.11.5", "26.05.5"])
def test_the_lost_runs_epilog_ends_its_live_run_on_every_slurm_version(tmp_path, version):
    """The hooks in-process on the Prolog and Epilog environments of a requeued job captured on real Slurm
    (tests/data/runs: the Epilog of run 0 already counts the requeue; 24.11+ give its start time, 26.05 its
    SLUID): the node lost the Prolog state in between, so the Epilog's record is provisional, and ingest ties
    it to run 0, which was live on that node: one row, not running, the live figures kept."""
    from test_runs import Node

    node = Node(tmp_path, version)
    cfg = load(node.site.config_path)
    node.run("prolog0", GPUEFF_SIM_PROFILE="bf16-healthy")
    saved = json.loads(Path(node.site.state_file(_job_id(version))).read_text())
    (path,) = live.publish(cfg, now=saved["start_time"] + BUSY_S)
    shutil.rmtree(node.site.state)
    node.run("epilog0")
    (final,) = [r for name, r in node.records().items() if "~live" not in name]
    assert final["run_provisional"] is True and final["run"] == 1
    engine = make_engine(str(tmp_path / "g.db"))
    try:
        res = ingest_spool(engine, node.site.spool)
        assert (res.ingested, res.quarantined, res.failed) == (2, 0, 0), res.errors
        with Session(engine) as s:
            (job,) = s.exec(select(Job)).all()
            (gpu,) = s.exec(select(JobGpu)).all()
        assert (job.run, job.record_source) == (0, "hook") and gpu.kernel_active > 0.9
        assert "no Prolog state for this job" in job.reason
    finally:
        engine.dispose()


def _job_id(version: str) -> int:
    from test_runs import VERSIONS

    return VERSIONS[version]


class Reader:
    """The sacct reader interface over given records (as SacctReader.jobs with runs=True)."""

    batch_size = 500

    def __init__(self, *jobs: SacctJob):
        self.all = list(jobs)

    def jobs(self, ids, cluster=None, runs=False):  # noqa: ANN001
        return [j for j in self.all if j.job_id in set(ids)]


def _sj(job_id: int, run: int, state: str, start: float | None, end: float | None, **kw) -> SacctJob:
    return SacctJob(job_id=job_id, job_id_text=str(job_id), cluster="testc", user="alice", uid=1000,
                    account="proj", state=state, start=start, end=end, submit=T0 - 60, run=run, gpu_count=1,
                    elapsed_s=(end - start) if start and end else None, **kw)


def test_enrichment_ends_a_live_run_that_another_nodes_unsettled_record_joins(tmp_path):
    """Node A is still live in the database; node B's Epilog had no Prolog state, its record not tied to A's
    run at ingest (B never published). Enrichment settles B's record into the run: the run ends there (not
    running, NODE_FAIL from accounting), B's reason joins, A's live figures stay with their coverage note."""
    engine = make_engine(str(tmp_path / "g.db"))
    try:
        with Session(engine) as s:
            ingest_record(s, make_record(5, node="nodeA", gpus=1, start=T0, end=T0 + BUSY_S, live=True,
                                         exit_code=None, signal=None))
            b = make_record(5, node="nodeB", gpus=1, start=None, end=T0 + 300, run=0, run_provisional=True,
                            reason="no Prolog state for this job: start time unknown")
            b["gpus"][0].update(dict.fromkeys(record.METRICS), samples=0, timeline=[])
            ingest_record(s, b)
            s.commit()
            assert sorted((j.run, j.record_source) for j in s.exec(select(Job)).all()) == [(-int(T0 + 300), "hook"),
                                                                                           (0, "live")]
        res = enrich_jobs(engine, Reader(_sj(5, 0, "NODE_FAIL", T0, T0 + 290)), settle_s=0, now=T0 + 600)
        assert res.errors == [] and res.enriched == 1, res
        with Session(engine) as s:
            (job,) = s.exec(select(Job)).all()
            gpus = {g.node: g for g in s.exec(select(JobGpu)).all()}
        assert (job.run, job.record_source, job.state, job.nodelist) == (0, "hook", "NODE_FAIL", "nodeA,nodeB")
        assert "no Prolog state for this job" in job.reason
        assert gpus["nodeA"].kernel_active == 0.9
        assert "measured up to the last reading at 08:01:21 UTC" in gpus["nodeA"].window["break"]
        assert gpus["nodeB"].kernel_active is None
    finally:
        engine.dispose()


def test_an_unsettled_record_is_not_matched_to_a_run_that_never_started():
    """A requeued run cancelled while it waited never started: an Epilog's record cannot be its."""
    row = Job(cluster="testc", job_id=5, run=-int(T0 + 300), end_time=datetime.fromtimestamp(T0 + 300, UTC)
              .replace(tzinfo=None))
    ran, waited = _sj(5, 0, "NODE_FAIL", T0, T0 + 299), _sj(5, 1, "CANCELLED", None, T0 + 400)
    assert match_run(row, [ran, waited]) is ran


def test_who_cancelled_a_job_is_said_on_its_card_and_json(tmp_path):
    """Cancelled by gpueff's idle-GPU policy (its audit names the run), or by whom Slurm's accounting says
    (``CANCELLED by 1000`` in sacct -P, ``kill_request_user`` in --json): the reason, shown on the card's Note
    line and in ``--json``, says who and why."""
    from slurm_gpueff.analysis import assess, job_figures
    from slurm_gpueff.config import Config
    from slurm_gpueff.render import dumps, render_card
    from slurm_gpueff.reports.card import build_card

    assert cancelled_by("CANCELLED by 0") == "0" and cancelled_by("CANCELLED") is None
    assert cancelled_by("COMPLETED") is None and cancelled_by("CANCELLED by ٣") is None
    line = "|".join(["7", "7", "testc", "alice", "1000", "proj", "gpu", "normal", "n1", "gres/gpu=1", "1", "2",
                     "3", "1", "CANCELLED by 1000", "0:15", "name"])
    (pj,) = parse_parsable(line + "\n")
    assert (pj.state, pj.cancelled_by) == ("CANCELLED", "1000")
    (jj,), _meta = parse_json(json.dumps({"jobs": [{"job_id": 8, "state": {"current": ["CANCELLED"]},
                                                    "kill_request_user": "dave"}]}))
    assert (jj.state, jj.cancelled_by) == ("CANCELLED", "dave")

    engine = make_engine(str(tmp_path / "g.db"))
    try:
        with Session(engine) as s:
            for job_id in (6, 7, 8):
                ingest_record(s, make_record(job_id, gpus=1, start=T0, end=T0 + 900))
            s.add(AlertLog(at=datetime(2027, 1, 15, 8, 14), cluster="testc", job_id=6, run=0, user="alice",
                           action="cancel", detail="GPU 0 on node01: kernel 0.0 %, SM 0.00 % over 60.0 min measured",
                           outcome="cancelled; reason recorded in AdminComment; mailed alice@x.example"))
            s.commit()
        reader = Reader(_sj(6, 0, "CANCELLED", T0, T0 + 900, cancelled_by="0"),
                        _sj(7, 0, "CANCELLED", T0, T0 + 900, cancelled_by="1000"),
                        _sj(8, 0, "CANCELLED", T0, T0 + 900, cancelled_by="dave"))
        assert enrich_jobs(engine, reader, settle_s=0, now=T0 + 4000).enriched == 3
        with Session(engine) as s:
            jobs = {j.job_id: j for j in s.exec(select(Job)).all()}
            gpus = {j: s.exec(select(JobGpu).where(JobGpu.job_pk == jobs[j].id)).all() for j in jobs}
        assert jobs[6].reason == ("cancelled by gpueff's idle-GPU policy ([alerts]) at 2027-01-15 08:14 UTC: its "
                                  "GPUs were idle (GPU 0 on node01: kernel 0.0 %, SM 0.00 % over 60.0 min "
                                  "measured) after two warnings mailed to the owner")
        assert jobs[7].reason == "cancelled by its owner alice (uid 1000) (Slurm's accounting)"
        assert jobs[8].reason == "cancelled by dave (Slurm's accounting)"
        row6, gpus6 = rows_of_models(jobs[6], gpus[6])
        fig = job_figures(row6, gpus6)
        card = " ".join(render_card(row6, fig, assess(fig)).split())
        assert "State: CANCELLED" in card and "Note: cancelled by gpueff's idle-GPU policy ([alerts])" in card
        doc = json.loads(dumps([(row6, fig, assess(fig))]))["jobs"][0]["job"]
        assert doc["state"] == "CANCELLED" and doc["reason"].startswith("cancelled by gpueff's idle-GPU policy")
        page = build_card(row6, fig, assess(fig), [], Config())  # the mailed card (and --html) says it too
        assert "cancelled by gpueff&#39;s idle-GPU policy" in page.html(), page.html()
    finally:
        engine.dispose()


def test_a_final_record_that_comes_after_enrichment_ended_the_live_row(tmp_path):
    """A live row without new readings for 15 minutes is asked about (a node that died and stayed down runs no
    Epilog): accounting says the run ended, so enrichment finishes it; when its final record comes after all,
    its figures replace the live ones and the reason that said it never came goes."""
    engine = make_engine(str(tmp_path / "g.db"))
    try:
        with Session(engine) as s:
            ingest_record(s, make_record(9, gpus=1, start=T0, end=T0 + BUSY_S, live=True, exit_code=None,
                                         signal=None))
            s.commit()
        reader = Reader(_sj(9, 0, "COMPLETED", T0, T0 + 100))
        assert enrich_jobs(engine, reader, settle_s=0, now=T0 + BUSY_S + 600).checked == 0  # readings 10 min old
        assert enrich_jobs(engine, reader, settle_s=0, now=T0 + BUSY_S + 901).enriched == 1  # 15 min: asked
        with Session(engine) as s:
            job = s.exec(select(Job)).one()
            assert job.record_source == "hook" and "no final record came" in job.reason
            late = make_record(9, gpus=1, start=T0, end=T0 + 100)
            late["gpus"][0]["kernel_active"] = 0.5
            ingest_record(s, late)
            s.commit()
            job = s.exec(select(Job)).one()
            (gpu,) = s.exec(select(JobGpu)).all()
        assert job.reason is None and gpu.kernel_active == 0.5
    finally:
        engine.dispose()


def test_spool_names_of_the_crash_records_stay_apart():
    """The live record and the provisional final one of the same job never share a spool name."""
    live_rec = make_record(5, live=True, exit_code=None, signal=None)
    final = make_record(5, run=1, run_provisional=True, start=None, end=T0)
    assert spool.record_name(5, "node01", spool.live_tag(live_rec)) != \
        spool.record_name(5, "node01", spool.run_tag(final))
