"""Requeued jobs: a record and a job row per run, every run's GPU-hours counted (docs/DESIGN.md, "Runs").

The hooks run in-process on the Prolog/Epilog environments captured from a requeued job on real Slurm
22.05, 24.11 and 26.05 (tests/data/runs/README.md), with a GPU added; enrichment reads the same captures'
``sacct --json -D``. Database, ingest, summaries, rollups, metrics and the card are the real code.
"""

from __future__ import annotations

import copy
import glob
import json
import os
import sqlite3
from datetime import UTC

import pytest
from hooksite import HookSite, make_record
from pgutil import pg_url  # noqa: F401  (fixture)
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from record_rows import rows_of_models
from sqlmodel import Session, select

from slurm_gpueff import hook, record, spool
from slurm_gpueff.analysis import assess, job_figures
from slurm_gpueff.config import Config
from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.render import dumps, render_card
from slurm_gpueff.render.text import runs_line
from slurm_gpueff.service.metrics import registry_for
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.slurm.sacct import parse_json
from slurm_gpueff.slurm.sacct_rows import last_runs, number_runs
from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.enrich import enrich_jobs
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.rollups import refresh, usage

DATA = os.path.join(os.path.dirname(__file__), "data", "runs")
VERSIONS = {"22.05.8": 13, "24.11.5": 8, "26.05.5": 8}


def captured_env(version: str, which: str) -> dict[str, str]:
    """A captured hook environment: prolog0 / epilog0 (run 0's, count 1) / prolog1 / epilog1."""
    jid = VERSIONS[version]
    name = {"prolog0": f"prolog.{jid}.env", "epilog0": f"epilog.{jid}.r1.env", "prolog1": f"prolog.{jid}.r1.env"}
    if which == "epilog1":
        (path,) = glob.glob(os.path.join(DATA, version, f"epilog.{jid}.r1.*.env"))
    else:
        path = os.path.join(DATA, version, name[which])
    env = {}
    with open(path) as fh:
        for line in fh:
            key, sep, value = line.rstrip("\n").partition("=")
            if sep and not line.startswith("#"):
                env[key] = value
    return env


class Node:
    """A node's hook site, running the hooks in-process on captured environments (plus a GPU)."""

    def __init__(self, tmp_path, version: str):
        self.site = HookSite(str(tmp_path / "node"))
        self.version = version

    def run(self, which: str, **extra: str) -> None:
        env = captured_env(self.version, which) | {"SLURM_JOB_GPUS": "0", "GPUEFF_CONFIG": self.site.config_path}
        assert hook.run(which[:-1], env | extra) == 0

    def records(self) -> dict[str, dict]:
        out = {}
        for path in self.site.incoming():
            with open(path) as fh:
                out[os.path.basename(path)] = record.validate(json.load(fh))
        return out


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_each_run_is_its_own_record(tmp_path, version):
    """Prolog 0, Epilog 0 (count already 1), Prolog 1, Epilog 1: run 0 and run 1, both settled."""
    node, jid = Node(tmp_path, version), VERSIONS[version]
    for which in ("prolog0", "epilog0", "prolog1", "epilog1"):
        node.run(which)
    recs = node.records()
    assert sorted(recs) == [f"job-{jid}-r1-vm.json", f"job-{jid}-vm.json"]
    r0, r1 = recs[f"job-{jid}-vm.json"], recs[f"job-{jid}-r1-vm.json"]
    assert (r0["run"], r0["run_provisional"], r1["run"], r1["run_provisional"]) == (0, False, 1, False)
    assert r0["reason"] is None and r1["reason"] is None  # each Epilog found its own Prolog's state
    if version == "26.05.5":
        assert (r0["sluid"], r1["sluid"]) == ("s1P9M84NKN5600", "s1P9M84NMK2500")
    else:
        assert r0["sluid"] is None
    assert not os.listdir(os.path.join(node.site.state, "jobs"))  # both states consumed


@pytest.mark.parametrize("version", ["24.11.5", "26.05.5"])
def test_a_state_left_by_an_earlier_run_is_not_taken(tmp_path, version):
    """Run 0's Epilog never came and run 1's Prolog did not run on this node: run 1's Epilog (count 1) must
    not take run 0's state for its own. Run 0's SLUID (26.05) or its Prolog's time before SLURM_JOB_START_TIME
    (24.11+) tells them apart; the run is then provisional and the stale state removed."""
    node, jid = Node(tmp_path, version), VERSIONS[version]
    path = node.site.state_file(jid)
    node.run("prolog0")
    with open(path) as fh:
        saved = json.load(fh)
    # a run 0 that ran ten minutes (the captured one was requeued after a second: within the clock allowance)
    saved["start_time"] = float(captured_env(version, "epilog1")["SLURM_JOB_START_TIME"]) - 600
    with open(path, "w") as fh:
        json.dump(saved, fh)
    node.run("epilog1")
    (rec,) = node.records().values()
    assert (rec["run"], rec["run_provisional"]) == (1, True)
    assert "is another run's" in rec["reason"] and "start time from SLURM_JOB_START_TIME" in rec["reason"]
    assert rec["start_time"] == float(captured_env(version, "epilog1")["SLURM_JOB_START_TIME"])
    assert not os.path.exists(path)


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_an_epilog_without_prolog_state_records_a_provisional_run(tmp_path, version):
    """Run 0's Epilog alone sees count 1: run 1 provisional, with its times and SLUID, in a file of its own."""
    node, jid = Node(tmp_path, version), VERSIONS[version]
    node.run("epilog0")
    node.run("epilog1")
    recs = node.records()
    assert len(recs) == 2 and all(r["run"] == 1 and r["run_provisional"] for r in recs.values())
    assert all("no Prolog state" in r["reason"] for r in recs.values())
    if version == "22.05.8":  # no SLURM_JOB_START_TIME: start unknown, the end time (ms) names the file
        assert all(r["start_time"] is None for r in recs.values())
    else:
        starts = sorted(r["start_time"] for r in recs.values())
        assert starts == [float(captured_env(version, w)["SLURM_JOB_START_TIME"]) for w in ("epilog0", "epilog1")]
        assert sorted(recs) == [f"job-{jid}-r1p{int(s)}-vm.json" for s in starts]
    if version == "26.05.5":
        assert sorted(r["sluid"] for r in recs.values()) == ["s1P9M84NKN5600", "s1P9M84NMK2500"]


def test_spool_names_and_old_names():
    assert spool.record_name(8, "vm") == "job-8-vm.json"  # run 0: the name records always had
    assert spool.run_tag({"run": 0}) == "" and spool.run_tag({}) == ""
    assert spool.run_tag({"run": 2}) == "r2"
    assert spool.run_tag({"run": 1, "run_provisional": True, "start_time": None, "end_time": 17.9}) == "r1p17900"
    assert spool.run_tag({"run": 1, "run_provisional": True, "start_time": 16.0, "end_time": 17.9}) == "r1p16"
    assert spool.record_name(8, "vm", "r2") == "job-8-r2-vm.json"
    paths = ["/s/job-8-vm.json", "/s/job-9-vm.json", "/s/job-8-r1-vm.json", "/s/job-8-r1p5-vm.json"]
    assert spool.group_by_job(paths) == [["/s/job-8-vm.json", "/s/job-8-r1-vm.json", "/s/job-8-r1p5-vm.json"],
                                         ["/s/job-9-vm.json"]]


def test_record_run_fields_are_optional_and_checked():
    old = make_record(5)
    assert "run" not in old and record.validate(old)  # a record from before runs: run 0
    assert record.validate(make_record(5, run=1, run_provisional=True, sluid="s1P9M84NKN5600"))
    for bad in ({"run": -1}, {"run": "1"}, {"run_provisional": 1}, {"sluid": 5}):
        with pytest.raises(record.RecordError):
            record.validate(make_record(5) | bad)


class DashD:
    """The reader interface over the captured ``sacct --json -D``, numbering runs as SacctReader does."""

    batch_size = 500

    def __init__(self, version: str):
        with open(os.path.join(DATA, version, "sacct-D-requeue.json")) as fh:
            self.all = parse_json(fh.read())[0]
        self.calls: list[bool] = []

    def jobs(self, ids, cluster=None, runs=False):  # noqa: ANN001
        self.calls.append(runs)
        found = [copy.copy(j) for j in self.all if j.job_id in set(ids)]
        return number_runs(found) if runs else last_runs(found)  # as SacctReader.jobs


def sacct_runs(version: str) -> list:
    return DashD(version).all


def run_records(version: str, provisional: bool = False) -> list[dict]:
    """The two runs' records as the hooks write them, at accounting's times (one GPU each)."""
    recs = []
    for n, sj in enumerate(sacct_runs(version)):
        extra = {"run": n, "sluid": sj.sluid}
        if provisional:  # Epilogs without Prolog state: both see count 1; start from the env (24.11+) or unknown
            extra.update(run=1, run_provisional=True)
        rec = make_record(sj.job_id, node="vm", gpus=1, cluster="testcluster", start=float(sj.start),
                          end=float(sj.end), **extra)
        if provisional and version == "22.05.8":
            rec["start_time"] = None
        recs.append(rec)
    return recs


def store(tmp_path, recs: list[dict]):
    sp = str(tmp_path / "spool")
    for r in recs:
        spool.write_record(sp, r)
    engine = make_engine(str(tmp_path / "g.db"))
    res = ingest_spool(engine, sp)
    assert (res.ingested, res.quarantined, res.failed) == (len(recs), 0, 0)
    return engine


def rows(engine) -> list[Job]:
    with Session(engine) as s:
        return list(s.exec(select(Job).order_by(Job.run)).all())


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_two_runs_ingest_as_two_rows_and_enrich_from_their_own_sacct_runs(tmp_path, version):
    engine = store(tmp_path, run_records(version))
    assert [(j.run, j.gpu_count) for j in rows(engine)] == [(0, 1), (1, 1)]
    # ingesting the same records again changes nothing
    for r in run_records(version):
        spool.write_record(str(tmp_path / "spool"), r)
    assert ingest_spool(engine, str(tmp_path / "spool")).ingested == 2 and len(rows(engine)) == 2
    reader = DashD(version)
    res = enrich_jobs(engine, reader, settle_s=0)
    assert (res.enriched, res.not_found, res.not_final, res.errors) == (2, 0, 0, [])
    assert reader.calls == [True]  # asked with -D
    r0, r1 = rows(engine)
    sj0, sj1 = sacct_runs(version)
    assert (r0.state, r1.state) == ("REQUEUED", "COMPLETED")
    epoch = [t.replace(tzinfo=UTC).timestamp() for t in (r0.start_time, r0.end_time, r1.start_time, r1.end_time)]
    assert epoch == [sj0.start, sj0.end, sj1.start, sj1.end]
    assert r0.elapsed_s == sj0.elapsed_s and r1.elapsed_s == sj1.elapsed_s
    assert r1.sluid == sj1.sluid


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_provisional_runs_are_settled_by_enrichment(tmp_path, version):
    """Both Epilogs without Prolog state: two provisional rows (apart by start time, on 22.05 by end time),
    settled to runs 0 and 1 by SLUID (26.05) or by time overlap with sacct -D's runs."""
    recs = run_records(version, provisional=True)
    engine = store(tmp_path, recs)
    before = rows(engine)
    assert len(before) == 2 and all(j.run < 0 for j in before)
    res = enrich_jobs(engine, DashD(version), settle_s=0)
    assert (res.enriched, res.errors) == (2, [])
    assert [(j.run, j.state) for j in rows(engine)] == [(0, "REQUEUED"), (1, "COMPLETED")]


def test_a_provisional_run_folds_into_its_settled_rows_run(tmp_path):
    """Two nodes of run 0: one recorded it with the Prolog's state, one without: one row after enrichment."""
    version = "26.05.5"
    settled, _r1 = run_records(version)
    other = dict(settled, node="vm-2", run=1, run_provisional=True)
    other["gpus"] = [dict(g) for g in other["gpus"]]
    engine = store(tmp_path, [settled, other])
    assert sorted(j.run for j in rows(engine)) == [-int(other["start_time"]), 0]
    assert enrich_jobs(engine, DashD(version), settle_s=0).errors == []
    (j,) = rows(engine)
    assert (j.run, j.gpu_count, j.nodelist, j.state) == (0, 2, "vm,vm-2", "REQUEUED")
    with Session(engine) as s:
        assert sorted(g.node for g in s.exec(select(JobGpu)).all()) == ["vm", "vm-2"]


def test_rollups_metrics_and_card_count_every_run(tmp_path):
    version = "24.11.5"
    engine = store(tmp_path, run_records(version))
    enrich_jobs(engine, DashD(version), settle_s=0)
    cfg = Config({"paths": {"database": str(tmp_path / "g.db")}})
    assert summarize_pending(engine, cfg.analysis) == 2
    r0, r1 = rows(engine)
    assert r0.gpu_hours and r1.gpu_hours
    total = r0.gpu_hours + r1.gpu_hours
    refresh(engine, full=True)
    with engine.connect() as conn:
        (month,) = usage(conn, period="month", by="site")
    assert month["jobs"] == 1  # one job ...
    assert month["gpu_hours"] == pytest.approx(total)  # ... and the GPU-hours of both runs
    text = generate_latest(registry_for(engine, cfg)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (sample,) = fams["gpueff_gpu_hours_allocated"].samples
    assert sample.value == pytest.approx(total)
    assert sum(s.value for s in fams["gpueff_jobs"].samples) == 1

    with Session(engine) as s:
        items = []
        for j in s.exec(select(Job).order_by(Job.run)).all():
            row, gpus = rows_of_models(j, s.exec(select(JobGpu).where(JobGpu.job_pk == j.id)).all())
            fig = job_figures(row, gpus)
            items.append((row, fig, assess(fig)))
        runs = [(j, f) for j, f, _d in items]
        line = runs_line(runs)
        assert line.startswith("requeued once: 2 runs, ")
        from slurm_gpueff.fmt import gpu_hours

        assert f"{gpu_hours(r0.gpu_hours)} + {gpu_hours(r1.gpu_hours)} GPU-h" in line
        assert f"({gpu_hours(total)} in all;" in line
        card = render_card(*items[-1], runs)
        assert f"Runs: {line}" in card.replace("\n    ", " ")
        assert render_card(*items[-1]) == render_card(*items[-1], runs[-1:])  # one run: no Runs line
        assert "Runs:" not in render_card(*items[-1])
        doc = json.loads(dumps([items[-1]], [runs]))["jobs"][0]
        assert [(r["run"], r["state"]) for r in doc["runs"]] == [(0, "REQUEUED"), (1, "COMPLETED")]
        assert "runs" not in json.loads(dumps([items[-1]]))["jobs"][0]


def test_an_old_database_is_upgraded_to_runs_keeping_its_rows(tmp_path):
    """A database at 0003 (one row per job) goes to head: its rows become run 0, GPU rows intact, and a
    second run of the same job can then be stored."""
    path = tmp_path / "v3.db"
    engine = make_engine(f"sqlite:///{path}", create=False)
    assert migrate.upgrade(engine, "0003") == (None, "0003")
    con = sqlite3.connect(path)
    con.execute("INSERT INTO job (id, cluster, job_id, gpu_count, backend, record_source, enriched) "
                "VALUES (1, 'testcluster', 8, 1, 'nvml', 'hook', 0)")
    con.execute("INSERT INTO job_gpu (id, job_pk, node, gpu_index, source, samples) VALUES (7, 1, 'vm', 0, 'nvml', 3)")
    con.commit()
    con.close()
    assert migrate.upgrade(engine) == ("0003", migrate.head())
    con = sqlite3.connect(path)
    assert con.execute("SELECT j.job_id, j.run, j.sluid, g.id FROM job j JOIN job_gpu g ON g.job_pk = j.id"
                       ).fetchall() == [(8, 0, None, 7)]
    con.execute("INSERT INTO job (cluster, job_id, run, gpu_count, backend, record_source, enriched) "
                "VALUES ('testcluster', 8, 1, 1, 'nvml', 'hook', 0)")
    with pytest.raises(sqlite3.IntegrityError):
        con.execute("INSERT INTO job (cluster, job_id, run, gpu_count, backend, record_source, enriched) "
                    "VALUES ('testcluster', 8, 1, 1, 'nvml', 'hook', 0)")
    con.close()
    with engine.connect() as conn:
        assert migrate.diffs(conn) == []
    engine.dispose()


@pytest.mark.postgres
def test_two_runs_on_postgres(tmp_path, pg_url):  # noqa: F811
    """The same on PostgreSQL (COPY path, the run in the unique key, the rollup's count of last runs)."""
    migrate.upgrade(make_engine(pg_url, create=False))
    engine = make_engine(pg_url)
    sp = str(tmp_path / "spool")
    for r in run_records("26.05.5"):
        spool.write_record(sp, r)
    assert ingest_spool(engine, sp).ingested == 2
    assert enrich_jobs(engine, DashD("26.05.5"), settle_s=0).enriched == 2
    assert summarize_pending(engine) == 2
    refresh(engine, full=True)
    r0, r1 = rows(engine)
    with engine.connect() as conn:
        (month,) = usage(conn, period="month", by="site")
    assert (month["jobs"], month["gpu_hours"]) == (1, pytest.approx(r0.gpu_hours + r1.gpu_hours))
    engine.dispose()


def test_the_jobs_table_lists_each_run_and_counts_the_job_once(tmp_path):
    from slurm_gpueff.render.jobs_table import as_json, render
    from slurm_gpueff.storage.summaries import list_jobs

    engine = store(tmp_path, run_records("24.11.5"))
    assert summarize_pending(engine) == 2
    with Session(engine) as s:
        jobs = list_jobs(s)
    text = render(jobs)
    assert "8 (run 1)" in text and "Total (1 job)" in text
    doc = as_json(jobs, {})
    assert [j["run"] for j in doc["jobs"]] == [0, 1]
    # JSON keeps 6 decimals (fmt.number), as a card's --json does: these runs are seconds long
    assert doc["totals"]["gpu_hours"] == pytest.approx(sum(j.gpu_hours for j in jobs), abs=5e-7)


def test_the_mailed_card_and_html_show_every_run(tmp_path):
    """The mail (reports.runner.render_job_card) and ``seff-gpu --html`` carry the Runs line, and a requeued
    job writes one --html file, its last run's, not one per run under the same name."""
    from slurm_gpueff.cli import seff
    from slurm_gpueff.reports.runner import render_job_card

    version = "24.11.5"
    engine = store(tmp_path, run_records(version))
    enrich_jobs(engine, DashD(version), settle_s=0)
    cfg = Config({"paths": {"database": str(tmp_path / "g.db")}})
    summarize_pending(engine, cfg.analysis)
    r0, r1 = rows(engine)
    with Session(engine) as s:
        page = render_job_card(s, rows_of_models(s.get(Job, r1.id))[0], cfg)
        first = render_job_card(s, rows_of_models(s.get(Job, r0.id))[0], cfg)
    assert "Runs: requeued once: 2 runs, " in page.text.replace("\n    ", " ")
    assert "requeued once: 2 runs" in page.html()
    assert "requeued once" in first.text  # any run's card shows the job's runs
    conf = tmp_path / "gpueff.toml"
    conf.write_text(f'[paths]\ndatabase = "sqlite:///{tmp_path}/g.db"\n')
    out = tmp_path / "card.html"
    assert seff.main(["--config", str(conf), str(r1.job_id), "--html", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.glob("card*.html")) == ["card.html"]
    assert "requeued once: 2 runs" in out.read_text()
