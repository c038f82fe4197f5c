"""``seff-gpu`` end to end: a real SQLite database built with the real models, the command run as a
process (``python3 -m slurm_gpueff.cli.seff``, the same ``main`` the ``seff-gpu`` console script runs).

GPU figures come from the simulated collector (no GPU here); ``squeue`` is a small stand-in script
because no Slurm controller runs on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib

import pytest
from sites import NO_GPM, job_site, sim_record, store
from sqlmodel import Session

from slurm_gpueff.access.client import api_url
from slurm_gpueff.cli import seff
from slurm_gpueff.config import Config
from slurm_gpueff.models import Job
from slurm_gpueff.seff.answer import still_running
from slurm_gpueff.slurm.jobid import parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.process  # its tests start real processes (CLI commands, hooks, services)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    def fill(s: Session) -> None:
        store(s, sim_record(4201, "bf16-healthy", 2, 6.0))
        store(s, sim_record(4203, "one-sm-spin", 1, 2.0))
        store(s, sim_record(4209, "one-of-n-gpus", 4, 4.0))
        # nvml backend on a pre-Hopper GPU: kernel activity, memory, power; no SM/tensor/DRAM.
        rec = sim_record(4300, "bf16-healthy", 1, 1.0, backend="nvml")
        for m in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active", "fp32_active",
                  "fp16_active"):
            rec["gpus"][0][m] = None
            rec["gpus"][0]["missing"][m] = NO_GPM
        rec["gpus"][0]["source"] = "nvml"
        store(s, rec, state=None)  # a hook record only: not enriched
        # array 5000 with 3 tasks; array 6000 with 12 tasks
        for task in range(3):
            store(s, sim_record(5001 + task, "starved", 1, 1.0, array_job_id=5000, array_task_id=task))
        for task in range(12):
            store(s, sim_record(6001 + task, "idle", 1, 0.5, array_job_id=6000, array_task_id=task))
        s.add(Job(cluster="demo", job_id=7000, gpu_count=0, state="COMPLETED"))  # a CPU-only job

    return job_site(tmp_path_factory.mktemp("site"), fill)


def run(site, *args, env_extra=None, config=True):
    root, cfg = site
    env = dict(os.environ, PYTHONPATH=ROOT, PATH=f"{root}/bin:/usr/bin:/bin")
    env.pop("GPUEFF_CONFIG", None)
    env.update(env_extra or {})
    argv = [sys.executable, "-m", "slurm_gpueff.cli.seff", *args] + (["--config", str(cfg)] if config else [])
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, cwd=root)


def test_card_of_a_healthy_two_gpu_job(site):
    p = run(site, "4201")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    for line in ("Job ID: 4201", "Cluster: demo", "User/Account: alice/vision",
                 "State: COMPLETED (exit code 0)", "Partition: gpu", "Nodes: 1 (gpu-node01)",
                 "GPUs: 2 x Simulated H100 80GB", "Elapsed: 06:00:00",
                 "GPU-hours allocated: 12.00", "Verdict: Healthy", "Per GPU:",
                 "Measured by: simulated (SIMULATED DATA \u2014 not a real GPU)"):
        assert line in out, line
    assert out.startswith("*** SIMULATED DATA")
    assert "(efficiency SM/kernel:" in out
    assert "Peak GPU memory: 68.0 of 80.0 GiB on the fullest GPU" in out
    assert "gpu-node01:0" in out and "gpu-node01:1" in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_busy_not_working_card_shows_the_split(site):
    out = run(site, "4203").stdout
    assert "Verdict: Busy but not working" in out
    assert "Also: Oversized" in out
    assert "busy, SMs not active:" in out and "Things to try:" in out
    assert "Per GPU:" not in out  # one GPU: no per-GPU table


def test_three_of_four_gpus_never_used(site):
    out = run(site, "4209").stdout
    assert "Verdict: 3 of 4 GPUs never used" in out
    rows = [line for line in out.splitlines() if line.startswith("  gpu-node01:")]
    assert len(rows) == 4 and sum("GPU never used" in r for r in rows) == 3


def test_unmeasured_figures_read_na_with_reason(site):
    p = run(site, "4300")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert f"SM-active: n/a ({NO_GPM})" in out
    assert "Tensor-active: n/a (as above)" in out
    assert "SM-active: 0" not in out
    assert "State: ENDED (" in out
    assert "Verdict: none (no problem found in what was measured" in out
    assert "Not assessed: Busy but not working, Tensor cores idle" in out
    assert "nvml (NVML without GPM" in out
    assert "SIMULATED" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_json_document(site):
    p = run(site, "4209", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema"] == "slurm-gpueff/seff-gpu" and doc["schema_version"] == 1
    (job,) = doc["jobs"]
    assert set(job) == {"job", "figures", "cpu", "waste", "verdicts", "not_assessed", "gpus"}
    assert job["job"]["job_id"] == 4209 and job["job"]["gpu_count"] == 4
    assert job["figures"]["gpu_hours"]["value"] == pytest.approx(16.0)
    assert job["figures"]["sm_active"]["source"] == "simulated"
    w = job["waste"]
    assert w["idle_gpu_hours"] + w["underfilled_gpu_hours"] + w["sm_active_gpu_hours"] == pytest.approx(16.0)
    v = job["verdicts"][0]
    assert v["name"] == "never_used" and v["title"] == "3 of 4 GPUs never used"
    assert v["gpus"] == [{"node": "gpu-node01", "index": i} for i in (1, 2, 3)]
    assert len(job["gpus"]) == 4 and job["gpus"][1]["kernel_active"] == 0.0


def test_json_keeps_unknowns_null(site):
    job = json.loads(run(site, "4300", "--json").stdout)["jobs"][0]
    assert job["figures"]["sm_active"] == {"value": None, "source": "none", "missing": NO_GPM}
    assert job["waste"]["sm_active_gpu_hours"] is None and job["waste"]["idle_gpu_hours"] is not None
    assert job["verdicts"] == []
    assert {s["name"] for s in job["not_assessed"]} >= {"busy_not_working", "healthy"}


def test_array_job_prints_one_card_per_task(site):
    out = run(site, "5000").stdout
    assert out.startswith("3 jobs match 5000")
    assert out.count("Verdict: Starved") == 3
    assert "Job ID: 5000_2 (raw id 5003)" in out
    one = run(site, "5000_1").stdout
    assert one.count("Job ID:") == 1 and "5000_1 (raw id 5002)" in one


def test_large_array_prints_a_table(site):
    out = run(site, "6000").stdout
    assert out.startswith("12 jobs match 6000")
    assert "Job ID:" not in out
    assert out.count("GPU never used") == 12 and "6000_11" in out


@pytest.mark.parametrize("args, code, message", [
    (["12x"], 2, "invalid job id"),
    (["99999"], 3, "not in the GPU job database"),
    (["7000"], 5, "had no GPUs"),
])
def test_exit_codes(site, args, code, message):
    p = run(site, *args)
    assert p.returncode == code
    assert message in p.stderr and p.stdout == ""


@pytest.mark.parametrize("args, message", [
    (["-u", "alice", "--html", "f.html"], "--html writes a job's card: give a JOBID, not -u/-A"),
    (["-A", "vision", "--html", "f.html"], "--html writes a job's card"),
    (["4201", "-u", "alice"], "-u/--user (a table of jobs) cannot be combined with a JOBID"),
    (["4201", "-A", "vision"], "-A/--account (a table of jobs) cannot be combined with a JOBID"),
    (["4201", "-S", "2025-01-01"], "-S/--starttime (a table of jobs) cannot be combined with a JOBID"),
    (["4201", "-E", "2025-01-01"], "-E/--endtime (a table of jobs) cannot be combined with a JOBID"),
])
def test_flags_of_the_other_mode_are_refused(site, args, message, tmp_path):
    """A JOBID shows its card, -u/-A list jobs: a flag that only the other mode reads is refused, not ignored."""
    p = run(site, *args)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert p.stderr.startswith("seff-gpu: error: ") and len(p.stderr.splitlines()) == 1
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert not (site[0] / "f.html").exists()


def test_a_window_that_ends_before_it_starts_is_refused(site):
    p = run(site, "-u", "alice", "-S", "2025-02-01", "-E", "2025-01-01")
    assert p.returncode == 2 and "-S/--starttime must be before -E/--endtime" in p.stderr and p.stdout == ""


def test_bad_config_is_usage_error(site, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[paths]\ndatabse = 'x'\n")
    p = run(site, "4201", "--config", str(bad), config=False)
    assert p.returncode == 2 and "did you mean 'database'" in p.stderr


def test_running_job_by_prolog_state_file(site):
    root, _ = site
    state = root / "run" / "jobs" / "8100.json"
    state.write_text("{}")
    try:
        p = run(site, "8100")
    finally:
        state.unlink()
    assert p.returncode == 4 and "has not finished" in p.stderr


def test_running_job_by_squeue(site):
    root, _ = site
    bindir = root / "bin"
    bindir.mkdir(exist_ok=True)
    squeue = bindir / "squeue"
    squeue.write_text('#!/bin/sh\n[ "$3" = "8200_3" ] && echo RUNNING\nexit 0\n')
    squeue.chmod(0o755)
    try:
        p = run(site, "8200_3")
        q = run(site, "8201")
    finally:
        squeue.unlink()
    assert p.returncode == 4 and "squeue reports it RUNNING" in p.stderr
    assert q.returncode == 3


def test_squeue_is_bounded_by_a_timeout(tmp_path, monkeypatch):
    slow = tmp_path / "squeue"
    slow.write_text("#!/bin/sh\nsleep 30\necho RUNNING\n")
    slow.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    t0 = time.monotonic()
    config = Config({"paths": {"state_dir": str(tmp_path / "state")}})
    assert still_running(parse("1"), config, timeout=0.5) is None
    assert time.monotonic() - t0 < 5


def test_missing_database_is_a_clear_error(site, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\ndatabase = "{tmp_path}/nope.db"\nstate_dir = "{tmp_path}/run"\n')
    p = run(site, "4201", "--config", str(cfg), config=False)
    assert p.returncode == 1 and "does not exist yet" in p.stderr
    assert not (tmp_path / "nope.db").exists()  # looking never creates an empty database


def test_unreadable_database_is_a_clear_error(site, tmp_path):
    db = tmp_path / "junk.db"
    db.write_bytes(b"this is not a database" * 100)
    cfg = tmp_path / "c.toml"
    cfg.write_text(f'[paths]\ndatabase = "{db}"\nstate_dir = "{tmp_path}/run"\n')
    p = run(site, "4201", "--config", str(cfg), config=False)
    assert p.returncode == 1 and "cannot read the job database" in p.stderr
    assert "Traceback" not in p.stderr


def test_help_explains_ids_and_exit_codes(site):
    p = run(site, "--help", config=False)
    assert p.returncode == 0
    assert "123_4" in p.stdout and "exit status" in p.stdout and "5 job had no GPUs" in p.stdout


def test_console_script_points_at_main():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        scripts = tomllib.load(fh)["project"]["scripts"]
    assert scripts["seff-gpu"] == "slurm_gpueff.cli.seff:main"
    assert scripts["gpueff"] == "slurm_gpueff.cli.gpueff:main"


def test_service_address_from_api_listen():
    def url(**service):
        return api_url(Config({"service": service}).service)

    assert url() == ""
    assert url(api_listen="unix:/run/gpueff/api.sock") == "unix:/run/gpueff/api.sock"
    assert url(api_listen="0.0.0.0:9818") == "http://127.0.0.1:9818"
    assert url(api_listen="[::]:9818") == "http://[::1]:9818"
    assert url(api_listen="gpueff-host:9818") == "http://gpueff-host:9818"
    assert url(api_listen="0.0.0.0:9818", api_url="http://svc.example:80") == "http://svc.example:80"


def test_no_service_for_a_private_database_is_one_line(site):
    """GPUEFF_SEFF_VIA=service stands for a user who cannot read the database (the test runs as root)."""
    p = run(site, "4201", env_extra={"GPUEFF_SEFF_VIA": "service"})
    assert p.returncode == 1 and p.stdout == "" and p.stderr.count("\n") == 1
    assert "private to the service account" in p.stderr and "[service] api_listen" in p.stderr


def empty_database(where) -> str:
    """A job database with no job in it: a job id asked of it does not exist (exit 3)."""
    from slurm_gpueff.storage.db import make_engine

    make_engine(str(where / "empty.db")).dispose()
    return str(where / "empty.db")


def scontrol_saying(where, private_data: str | None) -> str:
    """A directory holding a stand-in ``scontrol`` (no controller runs outside tests/slurm/) that prints what
    ``scontrol show config`` prints of ``PrivateData`` (``none``, ``jobs,usage``), or fails as it does with no
    controller (``private_data`` None). Put on PATH, the Slurm runner finds it there."""
    bin_dir = where / "slurm-bin"
    bin_dir.mkdir()
    body = (f"printf 'PrivateData             = %s\\n' '{private_data}'" if private_data is not None else
            "echo 'slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)' >&2; exit 1")
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\n[ "$1 $2" = "show config" ] || exit 2\n{body}\n')
    (bin_dir / "scontrol").chmod(0o755)
    return str(bin_dir)


@pytest.mark.parametrize("private_data", ["none", "accounts,jobs,usage", None])
def test_another_users_job_running_here_answers_like_any_other_path(tmp_path, monkeypatch, private_data):
    """A job running on this node (its Prolog state is here) is shown as running only to those who may see its
    card: its owner, a lead of its account, an admin. Anyone else gets the refusal a finished job's card
    gives (exit 6), not "still running" (which would tell that the job exists and runs here); where Slurm's
    PrivateData hides jobs (or scontrol cannot say, the safe side), exactly the answer of a job that does not
    exist, whether --json or not."""
    from slurm_gpueff import jobstate, statedir
    from slurm_gpueff.access.privacy import Viewer
    from slurm_gpueff.seff.answer import answer
    from slurm_gpueff.seff.query import EXIT_DENIED, EXIT_RUNNING, EXIT_UNKNOWN, SeffQuery

    monkeypatch.setenv("PATH", scontrol_saying(tmp_path, private_data))
    config = Config({"paths": {"state_dir": str(tmp_path / "state"), "database": empty_database(tmp_path)}})
    hidden = private_data != "none"
    missing = {as_json: answer(SeffQuery(jobid="8200", json=as_json), config, Viewer(1001, "alice"))
               for as_json in (False, True)}  # before the job runs here: it does not exist
    assert missing[False].exit_code == EXIT_UNKNOWN and missing[True] == missing[False], missing
    jobstate.save(statedir.job(config.paths.state_dir, 8200),
                  {"start_time": 1.7e9, "job": {"job_id": 8200, "user": "bob", "uid": 1002, "account": "physics"}})
    asked = SeffQuery(jobid="8200")
    for who, status in ((Viewer(1001, "alice"), EXIT_UNKNOWN if hidden else EXIT_DENIED),
                        (Viewer(1002, "bob"), EXIT_RUNNING),
                        (Viewer(1003, "carol", accounts=frozenset({"physics"})), EXIT_RUNNING),
                        (Viewer(1009, "eve", all=True), EXIT_RUNNING)):
        got = answer(asked, config, who)
        assert got.exit_code == status, (who, got)
    for as_json in (False, True):
        other = answer(SeffQuery(jobid="8200", json=as_json), config, Viewer(1001, "alice"))
        if hidden:
            assert other == missing[as_json]
        else:
            assert "belongs to another user" in other.stderr and "running" not in other.stderr


@pytest.mark.parametrize("private_data", ["none", "jobs"])
def test_another_users_job_that_squeue_shows_answers_like_any_other_path(tmp_path, monkeypatch, private_data):
    """Where no Prolog state is on this host, squeue says whether the job still runs, and whose it is: only
    those who may see the card hear that it runs; where Slurm hides jobs, anyone else hears what a job that does
    not exist gives. (The squeue here is a stand-in printing what `squeue -h -o '%T|%u|%a'` prints, beside a
    stand-in scontrol; the real ones of three Slurm versions run in tests/slurm/.)"""
    from slurm_gpueff.access.privacy import Viewer
    from slurm_gpueff.seff.answer import answer
    from slurm_gpueff.seff.query import EXIT_DENIED, EXIT_RUNNING, EXIT_UNKNOWN, SeffQuery
    from slurm_gpueff.slurm.commands import ActiveJob, parse_active

    bin_dir = scontrol_saying(tmp_path, private_data)
    squeue = tmp_path / "slurm-bin" / "squeue"
    squeue.write_text("#!/bin/sh\n[ -e \"$0.off\" ] || echo 'RUNNING|bob|physics'\n")
    squeue.chmod(0o755)
    monkeypatch.setenv("PATH", bin_dir)
    config = Config({"paths": {"state_dir": str(tmp_path / "state"), "database": empty_database(tmp_path)}})
    asked = SeffQuery(jobid="8300")
    other = answer(asked, config, Viewer(1001, "alice"))
    assert other.exit_code == (EXIT_DENIED if private_data == "none" else EXIT_UNKNOWN)
    assert answer(asked, config, Viewer(1002, "bob")).exit_code == EXIT_RUNNING
    assert answer(asked, config, Viewer(1003, "carol", accounts=frozenset({"physics"}))).exit_code == EXIT_RUNNING
    (tmp_path / "slurm-bin" / "squeue.off").touch()  # the job ends: squeue lists nothing, no record either
    if private_data == "jobs":
        assert answer(asked, config, Viewer(1001, "alice")) == other
    assert parse_active("PENDING|alice|vision\nRUNNING|alice|vision\n") == ActiveJob("PENDING", "alice", "vision")
    assert parse_active("RUNNING\n") == ActiveJob("RUNNING", None, None)
    assert parse_active("COMPLETED|a|b\n") is None


def test_private_data_is_read_from_scontrol_and_kept_a_while(tmp_path, monkeypatch, caplog):
    """``scontrol show config``'s PrivateData line, as Slurm 22.05 to 26.05 print it (``none``, or its flags
    comma-separated), read through the Slurm runner; kept PRIVATE_DATA_TTL_S in the process (the service asks
    once every few minutes); scontrol failing hides jobs and says so in the log once."""
    from slurm_gpueff.access import privacy
    from slurm_gpueff.errors import SlurmCommandError
    from slurm_gpueff.slurm.commands import parse_private_data

    assert parse_private_data("AuthType                = auth/munge\nPrivateData             = none\n") == frozenset()
    assert parse_private_data("PrivateData = accounts,Jobs,usage\n") == {"accounts", "jobs", "usage"}
    with pytest.raises(SlurmCommandError):
        parse_private_data("slurm_load_ctl_conf: nothing\n")
    monkeypatch.setenv("PATH", scontrol_saying(tmp_path, "jobs"))
    config = Config()
    assert privacy.hides_others_jobs(config)
    (tmp_path / "slurm-bin" / "scontrol").write_text("#!/bin/sh\nprintf 'PrivateData = none\\n'\n")
    assert privacy.hides_others_jobs(config)  # kept: not asked again within the TTL
    monkeypatch.setattr(privacy, "PRIVATE_DATA_TTL_S", 0.0)
    assert not privacy.hides_others_jobs(config)  # asked again once it is old
    (tmp_path / "slurm-bin" / "scontrol").write_text("#!/bin/sh\necho 'Unable to contact slurm controller' >&2\n"
                                                      "exit 1\n")
    with caplog.at_level("WARNING", logger="gpueff.privacy"):
        assert privacy.hides_others_jobs(config)
    assert "Slurm's PrivateData is unknown (scontrol failed (exit 1): Unable to contact slurm controller): " \
           "another user's job is answered as one that does not exist (exit 3), the safe side" in caplog.text


def test_watch_never_goes_back_to_older_figures(capsys, monkeypatch):
    """When the job ends, the node's up-to-the-second card is gone and the database still holds an earlier
    live row until the final record is ingested: --watch keeps the newer card and says the job ended."""
    from slurm_gpueff.seff.query import Answer

    answers = iter([Answer(0, "card as of 05:33:22\n", running=True, as_of="2026-11-27T05:33:22"),
                    Answer(0, "card as of 05:20:35\n", running=True, as_of="2026-11-27T05:20:35"),
                    Answer(0, "final card\n")])
    monkeypatch.setattr("time.sleep", lambda s: None)
    assert seff.watch(lambda: next(answers), 2) == 0
    out = capsys.readouterr().out
    assert "card as of 05:33:22" in out and "final card" in out and "05:20:35" not in out
    assert "the job has ended (or left this node): its final figures follow" in out
    assert Answer.from_json(Answer(0, "x", running=True, as_of="2026-11-27T05:33:22").to_json()).as_of == \
        "2026-11-27T05:33:22"
