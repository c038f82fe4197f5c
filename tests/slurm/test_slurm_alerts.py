"""Running jobs on real Slurm: live records, seff-gpu on a running job, and the idle-GPU policy end to end.

Real slurmctld/slurmd/slurmdbd (each version of tests/slurm/conftest.py), the real hooks, ``gpueff live``,
ingest, ``gpueff alerts run`` (real squeue, scontrol and scancel), mail through a real SMTP server on
loopback that first refuses the job owner's address. Only the GPUs are simulated: each job's profile (idle,
busy) is chosen before its Prolog runs.
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

[alerts]
enabled = true
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
from slurm_gpueff.node.liveview import answerer
from slurm_gpueff.node.live_socket import LiveServer, socket_path
from slurm_gpueff.config import load
cfg = load(sys.argv[1])
os.makedirs(os.path.join(cfg.paths.state_dir, "agent"), exist_ok=True)
LiveServer(socket_path(cfg.paths.state_dir), answerer(cfg)).serve_forever()
"""


def _config(c, port: int, cancel: bool) -> None:
    c.write_config()
    with open(c.config_path, "a") as fh:
        fh.write(ALERTS.format(port=port, cancel=str(cancel).lower(), exempt=OTHER_ACCOUNT))


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
    """The SMTP server refuses the owner's address at first: every pass warns again (each warning fails), nothing
    goes further and the audit says no mail reached anyone. Once mail goes through: the first warning, the
    second, then (cancel off) only a note that it would cancel, then (cancel on) the cancel, whose AdminComment
    says both warnings were mailed, which is true by construction."""
    c = slurm
    inbox, port = refusing_smtp_server
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

        # mail refused: each pass warns again, and nothing more happens to the job
        deadline = time.monotonic() + 90
        while sum(a["action"] == "warn" for a in _audit(c) if a["job_id"] == ids["idle"]) < 2:
            assert time.monotonic() < deadline, _audit(c)
            time.sleep(1.0)
            _pass(c)
        failed = [a for a in _audit(c) if a["job_id"] == ids["idle"]]
        assert [a["action"] for a in failed] == ["warn"] * len(failed), failed
        assert all(a["outcome"].startswith(f"mail to {USER}@cluster.example failed") for a in failed), failed
        assert inbox.messages == []
        inbox.accept = True

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

        rows = _audit(c)
        by_job = {name: [r["action"] for r in rows if r["job_id"] == j] for name, j in ids.items()}
        assert by_job["idle"] == ["warn"] * len(failed) + ["warn", "warn_again", "would_cancel", "cancel"], rows
        assert by_job["busy"] == [] and by_job["exempt"] == ["exempt"], rows
        cancel = next(r for r in rows if r["action"] == "cancel")
        assert cancel["outcome"].startswith("cancelled; reason recorded") and "kernel 0.0 %" in cancel["detail"]
        assert not any(r["dry_run"] for r in rows)
        mails = [(rcpt, m["Subject"]) for rcpt, m in inbox.messages]
        assert [r for r, _s in mails] == [[f"{USER}@cluster.example"]] * 3, mails
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

