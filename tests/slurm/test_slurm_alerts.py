"""Running jobs on real Slurm: live records, seff-gpu on a running job, and the idle-GPU policy end to end.

Real slurmctld/slurmd/slurmdbd (each version of tests/slurm/conftest.py), the real hooks, ``gpueff live``,
ingest, ``gpueff alerts run`` (real squeue, scontrol and scancel), mail through a real SMTP server on
loopback that first refuses the job owner's address (550) and accepts the admins'. Only the GPUs are
simulated: each job's profile (idle, busy) is chosen before its Prolog runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from .conftest import FINAL, OTHER_ACCOUNT, ROOT, USER

pytestmark = [pytest.mark.slurm, pytest.mark.smtp]

ALERTS = """
[mail]
host = "127.0.0.1"
port = {port}
from_address = "gpueff@cluster.example"

[reports]
address_pattern = "{{user}}@cluster.example"
admins = ["{admin}"]
dir = "{reports}"

[alerts]
enabled = true
interval_s = 2.0
max_mails_per_user_per_day = {max_mails}
window_min = 0.2
min_coverage_pct = 50.0
grace_min = 0.0
warn_again_min = 0.02
cancel_after_min = 0.0
cancel = {cancel}
exempt_accounts = ["{exempt}"]
"""


# What `gpueff agent` serves beside its sampling (no GPU here): seff-gpu's socket on the job's node.
SERVE_LIVE = """
import os, sys
from slurm_gpueff.seff.livecard import answerer
from slurm_gpueff import statedir
from slurm_gpueff.node.live_socket import LiveServer
from slurm_gpueff.config import load
cfg = load(sys.argv[1])
os.makedirs(os.path.join(cfg.paths.state_dir, "agent"), exist_ok=True)
LiveServer(statedir.live_socket(cfg.paths.state_dir), answerer(cfg)).serve_forever()
"""


ADMIN_MAIL = "hpc@cluster.example"
OWNER_MAIL = f"{USER}@cluster.example"
MAX_MAILS = 2  # warnings a day to one user


def _config(c, port: int, cancel: bool) -> None:
    c.write_config()
    with open(c.config_path, "a") as fh:
        fh.write(ALERTS.format(port=port, cancel=str(cancel).lower(), exempt=OTHER_ACCOUNT, admin=ADMIN_MAIL,
                               max_mails=MAX_MAILS, reports=f"{c.base}/gpueff/reports"))


def _submit(c, profile: str, *args: str, user: str | None = None) -> int:
    """A job whose simulated GPU follows ``profile``: held until the profile is in place for its Prolog."""
    j = c.sbatch("--hold", "--gres=gpu:1", *args, "--wrap", "sleep 600", user=user)
    os.makedirs(os.path.join(c.state, "sim"), exist_ok=True)
    with open(os.path.join(c.state, "sim", f"{j}.profile"), "w") as fh:
        fh.write(profile)
    c.run(["scontrol", "release", str(j)], check=True)
    return j


def _audit(c) -> list[dict]:
    return json.loads(c.gpueff("alerts", "log", "--json", "--limit", "1000").stdout)


def _pass(c) -> str:
    c.gpueff("live")
    c.gpueff("ingest")
    return c.gpueff("alerts", "run").stdout


def test_running_jobs_are_shown_and_an_idle_one_is_warned_then_cancelled(slurm, refusing_smtp_server):
    """The SMTP server refuses the owner's address (550) at first, for more warnings than the two a day allowed:
    nothing goes further than a warning and the audit says no mail reached anyone; the address is tried again
    after 1, 2, 4 intervals (held back in between) and the admins are told once. Once mail goes through, the
    next try is the first warning (the refused ones spent no allowance), then the second, then (cancel off)
    only a note that it would cancel, then (cancel on) the cancel, whose AdminComment says both warnings were
    mailed, which is true by construction; the cancelled job's card says gpueff's policy cancelled it, and why."""
    c = slurm
    inbox, port = refusing_smtp_server
    inbox.only = {OWNER_MAIL}
    _config(c, port, cancel=False)
    ids: dict[str, int] = {}
    try:
        ids = {"idle": _submit(c, "idle", user=USER), "busy": _submit(c, "bf16-healthy", user=USER),
               "exempt": _submit(c, "idle", "-A", OTHER_ACCOUNT)}
        c.wait_state(list(ids.values()), {"RUNNING"})
        for j in ids.values():  # the Prolog has run (PrologFlags=Alloc) once its state file is there
            deadline = time.monotonic() + 30
            while not os.path.exists(os.path.join(c.state, "jobs", f"{j}.json")):
                assert time.monotonic() < deadline, f"no Prolog state for job {j}"
                time.sleep(0.2)

        # a running job: its card so far, as its owner sees it through the service, and in the table
        c.gpueff("live")
        c.gpueff("ingest")
        p = c.seff(ids["busy"], user=USER)
        assert p.returncode == 0 and "State:" in p.stdout and "RUNNING (figures so far, as of" in p.stdout, p
        doc = json.loads(c.seff(ids["idle"], "--json", user=USER).stdout)["jobs"][0]
        assert doc["job"]["running"] is True and doc["gpus"][0]["kernel_active"] == 0.0
        table = c.seff(None, "-u", USER, "-s", "RUNNING", user=USER).stdout
        assert f"\n{ids['idle']} " in table and f"\n{ids['busy']} " in table and "RUNNING" in table, table
        assert table.startswith(f"Running GPU jobs of user {USER}: figures so far, each as of its latest reading")
        # on the job's node, the agent answers up to the second, as the kernel says who asks
        db_as_of = c.rows("SELECT end_time FROM job WHERE job_id = ?", (ids["busy"],))[0]["end_time"]
        srv = subprocess.Popen([sys.executable, "-c", SERVE_LIVE, c.config_path], env=dict(c.env, PYTHONPATH=ROOT))
        try:
            sock = os.path.join(c.state, "agent", "live.sock")
            deadline = time.monotonic() + 30
            while not os.path.exists(sock):
                assert time.monotonic() < deadline and srv.poll() is None, "the live socket did not come up"
                time.sleep(0.1)
            time.sleep(1.5)
            here = json.loads(c.seff(ids["busy"], "--json", user=USER).stdout)["jobs"][0]["job"]
            assert here["running"] is True and here["as_of"].replace("T", " ").rstrip("Z") > db_as_of, (here, db_as_of)
            p = c.seff(ids["exempt"], user=USER)  # root's job: the node refuses, and so does the service
            assert p.returncode == 6 and p.stdout == "", p
        finally:
            srv.terminate()
            srv.wait(10)

        # mail refused (550), more times than the day's allowance: the address backs off, the admins hear once
        deadline = time.monotonic() + 90
        while sum(a["action"] == "warn" for a in _audit(c) if a["job_id"] == ids["idle"]) <= MAX_MAILS:
            assert time.monotonic() < deadline, _audit(c)
            time.sleep(1.0)
            _pass(c)
        held = c.gpueff("alerts", "run").stdout  # within the wait after the third refusal (8 s)
        assert f"job {ids['idle']}: warn held back (mail to {OWNER_MAIL} refused permanently 3 times" in held, held
        failed = [a for a in _audit(c) if a["job_id"] == ids["idle"]]
        assert [a["action"] for a in failed] == ["warn"] * len(failed), failed
        assert all(a["outcome"].startswith(f"mail to {OWNER_MAIL} refused permanently") for a in failed), failed
        assert inbox.asked.count(OWNER_MAIL) == len(failed)  # a held-back pass did not ask the server
        assert [rcpt for rcpt, _m in inbox.messages] == [[ADMIN_MAIL]], inbox.messages
        assert f"warnings to {OWNER_MAIL} are refused" in inbox.messages[0][1]["Subject"]
        inbox.accept = True
        # the first try after the wait is the first warning, mailed: the refused ones spent no allowance
        deadline = time.monotonic() + 60
        while not any(a["action"] == "warn" and a["outcome"] == f"mailed {OWNER_MAIL}" for a in _audit(c)):
            assert time.monotonic() < deadline, _audit(c)
            time.sleep(1.0)
            out = _pass(c)
            assert "rate_limited" not in out, out
        assert [a["action"] for a in _audit(c) if a["job_id"] == ids["idle"]] == ["warn"] * (len(failed) + 1)

        # cancel off: warn, warn again, then only noted that it would cancel
        deadline = time.monotonic() + 90
        while not any(a["action"] == "would_cancel" for a in _audit(c)):
            assert time.monotonic() < deadline, _audit(c)
            time.sleep(2.0)
            _pass(c)
        assert c.job_info(ids["idle"]).get("JobState") == "RUNNING", "cancel = false must cancel nothing"

        # cancel on: the next pass cancels, with the reason in Slurm's accounting
        _config(c, port, cancel=True)
        out = _pass(c)
        assert f"job {ids['idle']}: cancel" in out, out
        assert c.wait_state([ids["idle"]], FINAL)[ids["idle"]] == "CANCELLED"
        c.wait_accounted([ids["idle"]])
        acct = c.run(["sacct", "-X", "-n", "-P", "-o", "State,AdminComment", "-j", str(ids["idle"])],
                     check=True).stdout
        assert acct.startswith("CANCELLED") and "slurm-gpueff: cancelled, GPUs idle" in acct, acct
        assert "after two warnings mailed to the owner" in acct, acct
        # the owner's card says who cancelled it and why (the audit's cancel of this run)
        deadline = time.monotonic() + 60
        while f"job-{ids['idle']}-{c.node}.json" not in c.spool_files():
            assert time.monotonic() < deadline, c.spool_files()
            time.sleep(0.3)
        c.gpueff("ingest")
        c.settle()
        c.gpueff("enrich", "--since", "now-1d")
        c.gpueff("ingest")
        card = " ".join(c.seff(ids["idle"], user=USER).stdout.split())
        assert "State: CANCELLED" in card and "Note: cancelled by gpueff's idle-GPU policy ([alerts])" in card, card
        assert "after two warnings mailed to the owner" in card, card
        doc = json.loads(c.seff(ids["idle"], "--json", user=USER).stdout)["jobs"][0]["job"]
        assert doc["reason"].startswith("cancelled by gpueff's idle-GPU policy"), doc

        rows = _audit(c)
        by_job = {name: [r["action"] for r in rows if r["job_id"] == j] for name, j in ids.items()}
        assert by_job["idle"] == ["warn"] * len(failed) + ["warn", "warn_again", "would_cancel", "cancel"], rows
        assert by_job["busy"] == [] and by_job["exempt"] == ["exempt"], rows
        cancel = next(r for r in rows if r["action"] == "cancel")
        assert cancel["outcome"].startswith("cancelled; reason recorded") and "kernel 0.0 %" in cancel["detail"]
        assert not any(r["dry_run"] for r in rows)
        mails = [(rcpt, m["Subject"]) for rcpt, m in inbox.messages if rcpt != [ADMIN_MAIL]]
        assert [r for r, _s in mails] == [[OWNER_MAIL]] * 3, mails
        assert len(inbox.messages) == 4  # and the one notice to the admins
        assert [s.split("]")[1].split(":")[0].strip() for _r, s in mails] == ["Warning", "Second warning",
                                                                              "Cancelled"]
        for name in ("busy", "exempt"):
            assert c.job_info(ids[name]).get("JobState") == "RUNNING", f"the {name} job must be left alone"
    finally:
        for j in ids.values():
            c.run(["scancel", str(j)])
        if ids:
            c.wait_state(list(ids.values()), FINAL)
        c.write_config()
        c.gpueff("ingest", check=False)

