"""A busy job's node crashes mid-job on real Slurm: the measured part stays, and the ended run is not running.

Real slurmctld/slurmd/slurmdbd, the real hooks, ``gpueff live``, ingest, enrich, ``gpueff alerts run`` (real
squeue) and ``seff-gpu`` as the job's owner. The crash: slurmd and the job's processes killed, the node's
gpueff state directory wiped as a reboot wipes /run, slurmd started again; Slurm then says NODE_FAIL, requeues
the job, and runs the Epilog of the lost run, which finds no Prolog state. Only the GPUs are simulated.

22.05 only: Slurm declares a lost batch job failed when its node registers again only if the job was last
seen more than BatchStartTimeout + MessageTimeout (20 s) before, so the test waits that long for the
controller, per version; the other versions' Epilog environments (SLURM_JOB_START_TIME, SLUID) are covered
by tests/test_node_crash.py on their captured hook environments.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from .conftest import FINAL, USER, VERSIONS, SlurmCluster

pytestmark = pytest.mark.slurm

ALERTS = """
[alerts]
enabled = true
dry_run = true
window_min = 0.2
min_coverage_pct = 0.0
grace_min = 0.0
"""
LOST_AFTER_S = 22.0  # BatchStartTimeout (10 s) + MessageTimeout (10 s), and a little


def _seff(c: SlurmCluster, *args: str) -> str:
    p = c.seff(*args, user=USER) if args and args[0] != "-u" else c.seff(None, *args, user=USER)
    assert p.returncode == 0, (p.stdout, p.stderr)
    return p.stdout


@pytest.mark.parametrize("slurm", [pytest.param(v, id=f"slurm-{v}") for v in VERSIONS if v == "22.05"],
                         indirect=True)
def test_a_busy_jobs_node_crash_keeps_the_measured_part_and_ends_the_run(slurm):
    c = slurm
    c.write_config()
    with open(c.config_path, "a") as fh:
        fh.write(ALERTS)
    j = c.sbatch("--hold", "--requeue", "--gres=gpu:1", "--wrap", "sleep 600", user=USER)
    os.makedirs(os.path.join(c.state, "sim"), exist_ok=True)
    with open(os.path.join(c.state, "sim", f"{j}.profile"), "w") as fh:
        fh.write("bf16-healthy")
    c.run(["scontrol", "release", str(j)], check=True)
    try:
        c.wait_state([j], {"RUNNING"})
        deadline = time.monotonic() + 30
        while not os.path.exists(os.path.join(c.state, "jobs", f"{j}.json")):
            assert time.monotonic() < deadline, f"no Prolog state for job {j}"
            time.sleep(0.2)
        time.sleep(2)  # some GPU time before the reading
        c.gpueff("live")
        c.gpueff("ingest")
        assert f"\n{j} " in _seff(c, "-u", USER, "-s", "RUNNING")
        assert c.gpueff("alerts", "run").stdout.startswith("1 running job(s) looked at")
        live = json.loads(_seff(c, str(j), "--json"))["jobs"][0]
        assert live["job"]["running"] is True and live["figures"]["kernel_active"]["value"] > 0.9

        c.crash_node(j)
        time.sleep(LOST_AFTER_S)  # the node is down, rebooting
        c.start_slurmd()
        deadline = time.monotonic() + 60
        while not [n for n in c.spool_files() if n.startswith(f"job-{j}-") and "~live" not in n]:
            assert time.monotonic() < deadline, (c.job_info(j), c.spool_files(), c.log_tail(30))
            time.sleep(0.3)
        info = c.job_info(j)
        assert info.get("Restarts") == "1" and info.get("JobState") in ("PENDING", "REQUEUED"), info
        (name,) = [n for n in c.spool_files() if n.startswith(f"job-{j}-") and "~live" not in n]
        rec = c.spool_record(name)
        assert rec["run_provisional"] is True and rec["reason"].startswith("no Prolog state"), rec
        assert rec["gpus"][0]["kernel_active"] is None  # the Epilog measured nothing, and says so

        c.gpueff("ingest")
        rows = c.rows("SELECT * FROM job WHERE job_id = ?", (j,))
        assert [(r["run"], r["record_source"]) for r in rows] == [(0, "hook")], [dict(r) for r in rows]
        card = " ".join(_seff(c, str(j)).split())
        assert "RUNNING" not in card and "GPU never used" not in card.replace("Not assessed: GPU never used", ""), card
        assert "Kernel-active: 9" in card and "Coverage: measured up to the last reading at " in card, card
        assert "Note: no Prolog state for this job" in card, card
        assert f"\n{j} " not in _seff(c, "-u", USER, "-s", "RUNNING")
        table = _seff(c, "-u", USER)
        line = next(x for x in table.splitlines() if x.startswith(f"{j} "))
        assert "RUNNING" not in line, table
        out = c.gpueff("alerts", "run").stdout
        assert out.startswith("0 running job(s) looked at"), out
        assert c.rows("SELECT count(*) AS n FROM live_sample")[0]["n"] == 0  # the pass dropped the ended run's

        # the requeued run waits (BeginTime): cancel it; accounting then has run 0 NODE_FAIL, run 1 never started
        c.run(["scancel", str(j)], check=True)
        c.wait_state([j], FINAL)
        c.wait_accounted([j])
        c.settle()
        c.gpueff("enrich", "--since", "now-1d")
        c.gpueff("ingest")
        rows = c.rows("SELECT * FROM job WHERE job_id = ?", (j,))
        assert [(r["run"], r["state"], r["record_source"]) for r in rows] == [(0, "NODE_FAIL", "hook")], \
            [dict(r) for r in rows]
        assert rows[0]["kernel_active"] > 0.9 and rows[0]["verdict"] != "never_used"
        assert rows[0]["gpu_hours"] < rows[0]["elapsed_s"] / 3600, dict(rows[0])  # measured time only
        card = " ".join(_seff(c, str(j)).split())
        assert "State: NODE_FAIL" in card and "Kernel-active: 9" in card and "Note: no Prolog state" in card, card
        doc = json.loads(_seff(c, str(j), "--json"))["jobs"][0]["job"]
        assert doc["state"] == "NODE_FAIL" and doc["running"] is False and "no Prolog state" in doc["reason"]
    finally:
        c.run(["scancel", str(j)])
        c.write_config()
        if c.wait_node_idle() != "idle":  # a crashed node may stay down: bring it back for the next tests
            c.run(["scontrol", "update", f"nodename={c.node}", "state=resume"])
