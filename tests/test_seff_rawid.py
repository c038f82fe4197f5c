"""``seff-gpu 2_0`` / ``6+1`` / ``2`` / ``6`` right after the job ended, before enrichment, and the state such
a card shows, also at a site without Slurm accounting.

The hooks on the nodes see only the raw job id (Slurm 22.05 to 26.05 give slurmd's Prolog/Epilog no
SLURM_ARRAY_* and no het offset; a het component's hooks see SLURM_HET_JOB_ID), so until ``gpueff enrich``
ran the record of task 2_0 is "job 9". seff-gpu then asks sacct which raw ids the typed id names. ``sacct``
here is tests/fake_slurm_cmd.py, a real process on PATH standing
in for Slurm (no slurmdbd runs for the unit tests): it answers from sacct output captured on a real Slurm
24.11 cluster (tests/data/slurmcmds/), where 2_0 is raw id 9, 6+1 raw id 7 and job 14 hit its time limit.
The records go through the real spool and ingest; the GPU figures come from the simulated collector.
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import subprocess
import sys
import time

import pytest
from sites import ingest_records, sim_record, site_config
from sqlmodel import Session, select

from slurm_gpueff.models import Job
from slurm_gpueff.slurm.sacct import parse_parsable
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.enrich import apply_sacct

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.process  # its tests start real processes (CLI commands, hooks, services)
FAKE = os.path.join(ROOT, "tests", "fake_slurm_cmd.py")
CAPTURE = os.path.join(ROOT, "tests", "data", "slurmcmds", "sacct-product-P-24.11.5.psv")
PENDING = "State: ENDED (the Epilog saw exit code 0; Slurm's final state not read from accounting yet)"


def install_fake(bin_dir, *names: str) -> None:
    """Copies of the stand-in, run by this Python; a ``squeue`` that reports nothing running."""
    os.makedirs(bin_dir, exist_ok=True)
    with open(FAKE) as fh:
        body = fh.read().split("\n", 1)[1]
    for name in names:
        path = os.path.join(bin_dir, name)
        with open(path, "w") as fh:
            fh.write(f"#!{sys.executable}\n{body}")
        os.chmod(path, 0o755)
    squeue = os.path.join(bin_dir, "squeue")
    with open(squeue, "w") as fh:
        fh.write("#!/bin/sh\nexit 0\n")
    os.chmod(squeue, 0o755)


def hook_record(job_id: int, start: float, end: float, profile: str = "idle") -> dict:
    """What the Epilog writes for raw job ``job_id``: no array ids nor het offset (the node does not see them),
    a het component's het job id (SLURM_HET_JOB_ID, which slurmd's hooks do see)."""
    return sim_record(job_id, profile, 1, start=start, end=end, cluster="testcluster", node="vm",
                      account="research", partition="debug", het_job_id=6 if job_id in (6, 7) else None)


@pytest.fixture
def site(tmp_path):
    # times from the capture: 2_0 ran 1795452978-79, 6+1 1795453005-06, 14 (TIMEOUT) 1795453011-95
    # and the array's other tasks 2_1 (raw 10), 2_2 (raw 2) and the het leader 6+0 (raw 6)
    times = ((9, 1795452978.0, 1795452979.0), (7, 1795453005.0, 1795453006.0), (14, 1795453011.0, 1795453095.0),
             (10, 1795452978.0, 1795452979.0), (2, 1795452978.0, 1795452979.0), (6, 1795453005.0, 1795453006.0))
    engine = make_engine(str(tmp_path / "jobs.db"))
    assert ingest_records(engine, tmp_path / "spool", (hook_record(*t) for t in times)).ingested == 6
    engine.dispose()
    install_fake(tmp_path / "bin", "sacct")
    (tmp_path / "run").mkdir()
    cfg = site_config(tmp_path, tmp_path / "jobs.db", cluster="testcluster",
                      extra="[privacy]\nenabled = false\n[sacct]\ntimeout_s = 2\n")
    return tmp_path, cfg


def seff(site, *args, mode: str = ""):
    root, cfg = site
    env = dict(os.environ, PYTHONPATH=ROOT, PATH=f"{root}/bin:/usr/bin:/bin", FAKE_SLURM_LOG=str(root / "calls"),
               FAKE_SLURM_MODE=mode, FAKE_SLURM_DATA=os.path.dirname(CAPTURE))
    env.pop("GPUEFF_CONFIG", None)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", *args, "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60, env=env, cwd=root)
    return p, time.monotonic() - t0


def calls(site) -> list[list[str]]:
    path = site[0] / "calls"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_array_task_is_found_through_its_raw_id(site):
    p, took = seff(site, "2_0")
    assert p.returncode == 0, p.stderr
    assert "Job ID: 2_0 (raw id 9)" in p.stdout
    assert PENDING in " ".join(p.stdout.split()) and "COMPLETED" not in p.stdout
    assert calls(site) == [["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,JobID", "-j", "2_0"]]  # one call
    assert took < 10, f"seff-gpu 2_0 took {took:.1f} s"


def test_het_component_is_found_through_its_raw_id(site):
    p, _ = seff(site, "6+1", "--json")
    assert p.returncode == 0, p.stderr
    (doc,) = json.loads(p.stdout)["jobs"]
    job = doc["job"]
    assert (job["id"], job["job_id"], job["het_job_id"], job["het_job_offset"]) == ("6+1", 7, 6, 1)
    assert job["state"] == "ENDED" and job["state_pending"] is True
    assert job["state_text"] == "ENDED (the Epilog saw exit code 0; Slurm's final state not read from accounting yet)"


def test_a_pending_arrays_own_record_is_not_taken_for_the_task(site):
    """sacct -j 2_0 of a task not started yet answers with the array's record (2_[0-2], raw id 2)."""
    p, _ = seff(site, "2_0", mode="pending")
    assert p.returncode == 3 and "not in the GPU job database" in p.stderr
    assert "Traceback" not in p.stderr


@pytest.mark.parametrize("mode", ["fail", "slow"])
def test_sacct_trouble_leaves_the_usual_answer(site, mode):
    """A failing or hung sacct: seff-gpu still answers (job unknown), bounded by [sacct] timeout_s = 2."""
    p, took = seff(site, "2_0", mode=mode)
    assert p.returncode == 3 and "not in the GPU job database" in p.stderr and "Traceback" not in p.stderr
    assert took < 15, f"took {took:.1f} s"


def test_timeout_job_reads_pending_then_timeout_once_enriched(site):
    """The Epilog of job 14 saw exit 0 (a TIMEOUT looks like success there): the card must not say
    COMPLETED. Enrichment writes accounting's record (the captured sacct line) and the card says TIMEOUT."""
    before, _ = seff(site, "14")
    assert before.returncode == 0 and PENDING in " ".join(before.stdout.split()) and "COMPLETED" not in before.stdout
    with open(CAPTURE) as fh:
        (sj,) = [j for j in parse_parsable(fh.read()) if j.job_id == 14]
    engine = make_engine(f"sqlite:///{site[0]}/jobs.db", create=False)
    with Session(engine) as s:
        job = s.exec(select(Job).where(Job.job_id == 14)).one()
        assert job.state == "COMPLETED" and not job.enriched  # the hook's provisional guess, stored
        apply_sacct(job, sj)
        s.commit()
    engine.dispose()
    after, _ = seff(site, "14")
    assert "State: TIMEOUT (exit code 0)" in after.stdout
    doc = json.loads(seff(site, "14", "--json")[0].stdout)["jobs"][0]["job"]
    assert (doc["state"], doc["state_pending"], doc["state_text"]) == ("TIMEOUT", False, "TIMEOUT (exit code 0)")
    # a raw id asks sacct (is it an array's or a het job's?) only while its record is not enriched
    assert calls(site) == [["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,JobID", "-j", "14"]]


def job_ids_shown(out: str) -> list[str]:
    return [ln.split("Job ID: ", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Job ID: ")]


def test_an_array_id_shows_every_task_before_accounting(site):
    """The issue's case on 22.05 and 26.05: `seff-gpu ARRAYID` showed one task, labelled with the bare array
    id (the task whose raw id equals it). sacct lists the array's tasks in one call; each is labelled."""
    p, _ = seff(site, "2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("3 jobs match 2\n")
    assert job_ids_shown(p.stdout) == ["2_0 (raw id 9)", "2_1 (raw id 10)", "2_2 (raw id 2)"]
    assert calls(site) == [["sacct", "-X", "-n", "-P", "-o", "JobIDRaw,JobID", "-j", "2"]]


def test_a_het_job_before_accounting_is_labelled_by_component(site):
    """The issue's case on 24.11 and 26.05: `seff-gpu 13+0` said "2 jobs match 13+0" and labelled the other
    component 13+0 too (both records carry the het job id, neither an offset); `seff-gpu 13` labelled the
    parts by their raw ids. Here het job 6 is raw ids 6 and 7."""
    p, _ = seff(site, "6+0")
    assert p.returncode == 0 and "jobs match" not in p.stdout, p.stdout
    assert job_ids_shown(p.stdout) == ["6+0 (raw id 6)"]
    (doc,) = json.loads(seff(site, "6+0", "--json")[0].stdout)["jobs"]
    assert (doc["job"]["job_id"], doc["job"]["het_job_id"], doc["job"]["het_job_offset"]) == (6, 6, 0)
    p, _ = seff(site, "6")
    assert p.stdout.startswith("2 jobs match 6\n") and job_ids_shown(p.stdout) == ["6+0 (raw id 6)", "6+1 (raw id 7)"]


def test_without_sacct_a_plain_id_says_what_it_cannot_show_yet(site):
    p, _ = seff(site, "2", mode="fail")
    assert p.returncode == 0 and job_ids_shown(p.stdout) == ["2"]
    note = " ".join(p.stdout.split("\n\n", 1)[0].split())
    assert max(len(line) for line in p.stdout.splitlines()) <= 80
    assert note.startswith("Note: Slurm's accounting was not read yet (") and "2_TASK" in note and \
        "once `gpueff enrich` has read accounting" in note, note
    p, _ = seff(site, "2", "--json", mode="fail")
    assert p.returncode == 0 and p.stderr.startswith("Note: ") and json.loads(p.stdout)["jobs"][0]["job"]["id"] == "2"


def test_a_site_without_accounting_says_the_epilogs_view_is_final(site):
    """[sacct] accounting = false (no slurmdbd): the card says what the Epilog saw is final, nothing waits for
    accounting or asks it (sacct would fail: the stand-in answers as Slurm without accounting storage)."""
    root, cfg = site
    cfg.write_text(cfg.read_text().replace("[sacct]\n", "[sacct]\naccounting = false\n") +
                   f'[reports]\ncards = true\ncard_min_gpu_hours = 0\ncard_lookback_h = 8760\ndir = "{root}/rep"\n'
                   'address_pattern = "{user}@example.org"\n')
    final = "State: ENDED (the Epilog saw exit code 0; final: this site keeps no Slurm accounting)"
    p, _ = seff(site, "14", mode="accounting-none")
    assert p.returncode == 0 and final in " ".join(p.stdout.split()), p.stdout
    # nothing will be read after the job: no CPU line that says it will (the card leaves the line out)
    assert "CPU:" not in p.stdout and "not known yet" not in p.stdout, p.stdout
    (doc,) = json.loads(seff(site, "14", "--json", mode="accounting-none")[0].stdout)["jobs"]
    assert (doc["job"]["state"], doc["job"]["state_pending"]) == ("ENDED", False)
    assert doc["cpu"]["missing"] == {"cpu_efficiency": "this site keeps no Slurm accounting",
                                     "max_rss_bytes": "this site keeps no Slurm accounting"}, doc["cpu"]
    p, _ = seff(site, "2_0", mode="accounting-none")
    assert p.returncode == 3 and "keeps no Slurm accounting" in p.stderr and "raw id" in p.stderr, p.stderr
    env = dict(os.environ, PYTHONPATH=ROOT, PATH=f"{root}/bin:/usr/bin:/bin", FAKE_SLURM_LOG=str(root / "calls"),
               FAKE_SLURM_MODE="accounting-none")
    gpueff = [sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg)]
    p = subprocess.run([*gpueff, "enrich"], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0 and "nothing to do: [sacct] accounting = false" in p.stdout, p.stdout + p.stderr
    from slurm_gpueff import spool

    now = time.time()  # a job that ended a minute ago: with accounting its card would wait for sacct
    spool.write_record(str(root / "spool"), hook_record(15, now - 7200, now - 60, profile="one-sm-spin"))
    assert subprocess.run([*gpueff, "ingest"], env=env, timeout=60).returncode == 0  # analyses the jobs
    p = subprocess.run([*gpueff, "report", "cards", "--dry-run"], capture_output=True, text=True, env=env,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    card = next((root / "rep").rglob("testcluster-15/message.eml")).read_text()  # sent now, no waiting
    assert "final: this site keeps no Slurm accounting" in " ".join(card.split())
    msg = email.message_from_string(card, policy=email.policy.default)
    parts = {part.get_content_type(): part.get_content() for part in msg.walk()
             if part.get_content_maintype() == "text"}
    assert set(parts) == {"text/plain", "text/html"}, set(parts)
    for kind, body in parts.items():  # the mail's text and HTML parts: no CPU line either
        assert "not known yet" not in body and "read after the job" not in body, kind
    assert "CPU:" not in parts["text/plain"] and ">CPU</td>" not in parts["text/html"]
    assert calls(site) == []  # neither seff-gpu nor the service asked sacct or sacctmgr


@pytest.mark.parametrize("private_data", ["none", "jobs"])
def test_another_users_cpu_only_job_is_not_told(tmp_path, monkeypatch, private_data):
    """A CPU-only job has no record; seff-gpu asks sacct, which (run by the service) knows every user's job,
    and said "had no GPUs" (exit 5) to anyone: which told that the job exists. Now only those who may see the
    job hear it; anyone else gets "not yours" (exit 6), or, where Slurm's PrivateData hides jobs, exactly the
    answer of a job that does not exist. Jobs 4, 8 and 14 of the capture are alice's (uid 1000), CPU only;
    scontrol is a stand-in printing the PrivateData line (no controller runs here)."""
    from slurm_gpueff.access.privacy import Viewer
    from slurm_gpueff.config import Config
    from slurm_gpueff.seff.answer import answer
    from slurm_gpueff.seff.query import SeffQuery

    bin_dir = tmp_path / "bin"
    install_fake(bin_dir, "sacct")
    (bin_dir / "scontrol").write_text(f"#!/bin/sh\nprintf 'PrivateData             = {private_data}\\n'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("FAKE_SLURM_DATA", os.path.dirname(CAPTURE))
    db = tmp_path / "gpueff.db"
    make_engine(str(db)).dispose()
    config = Config({"paths": {"database": str(db), "state_dir": str(tmp_path / "run")},
                     "sacct": {"command": str(bin_dir / "sacct")}})
    alice, bob = Viewer(1000, "alice"), Viewer(1002, "bob")
    for job in ("8", "14"):
        own = answer(SeffQuery(jobid=job), config, alice)
        assert own.exit_code == 5 and "had no GPUs allocated (sacct AllocTRES: " in own.stderr, own
        other = answer(SeffQuery(jobid=job), config, bob)
        if private_data == "none":
            assert other.exit_code == 6 and "belongs to another user" in other.stderr, other
        else:
            missing = answer(SeffQuery(jobid="99"), config, bob)  # no such job, in the database or sacct
            assert other.exit_code == 3 and other == missing._replace(stderr=missing.stderr.replace("99", job))
