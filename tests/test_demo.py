"""`gpueff demo`, the README's first command, end to end through the real console entry point."""

from __future__ import annotations

import json
import os
import pathlib
import shlex
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process  # gpueff demo, its hooks and seff-gpu run as processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPECTED = {  # demo job id -> primary verdict of its simulated profile
    4201: "healthy", 4202: "never_used", 4203: "busy_not_working", 4204: "busy_not_working",
    4205: "starved", 4206: "tensor_idle", 4207: "memory_bound", 4208: "oversized", 4209: "never_used",
}


def run(*args: str, cwd: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=300)


def test_demo_runs_every_profile_through_hooks_ingest_and_seff(tmp_path):
    p = run("slurm_gpueff.cli.gpueff", "demo", cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "ingested 9 spool records" in out and "quarantined 0, failed 0" in out
    assert out.count("*** SIMULATED DATA") == 9 + 1  # every card says the figures are simulated, the monthly too
    assert "56.00 GPU-hours allocated" in out
    # the simulated cluster's accounting is applied by the real enrichment: final states, never "pending"
    assert out.count("State: COMPLETED (exit code 0)") == 8 and out.count("State: FAILED (exit code 3)") == 1
    assert "not read from accounting yet" not in out and "ENDED" not in out
    root = tmp_path / "gpueff-demo"
    assert (root / "gpueff.toml").is_file() and (root / "gpueff.db").is_file()
    assert not list((root / "spool" / "incoming").glob("*.json"))  # everything ingested
    cfg = str(root / "gpueff.toml")
    # The closing hint works as printed: no venv on PATH, no PYTHONPATH, another working directory.
    hint = shlex.split(out.rstrip().splitlines()[-1].removeprefix("Try:"))
    assert os.path.isabs(hint[0]) and os.path.isfile(hint[0]), hint
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUEFF_CONFIG")}
    env["PATH"] = "/usr/bin:/bin"
    h = subprocess.run(hint, cwd="/", env=env, capture_output=True, text=True, timeout=120)
    assert h.returncode == 0, h.stderr
    assert json.loads(h.stdout)["jobs"][0]["job"]["job_id"] == 4201
    for job_id, verdict in EXPECTED.items():
        j = run("slurm_gpueff.cli.seff", "--config", cfg, "--json", str(job_id), cwd=str(tmp_path))
        assert j.returncode == 0, j.stderr
        doc = json.loads(j.stdout)["jobs"][0]
        assert doc["verdicts"][0]["name"] == verdict, job_id
        assert doc["job"]["backend"] == "simulated"


def test_demo_monthly_summary_is_labelled_simulated_and_counts_gpus(tmp_path):
    """Every figure the demo shows is simulated and says so: the cards did, the monthly summary (its text,
    HTML and mail Subject) and the demo's own summary table did not. The simulated cluster has no sacctmgr:
    the demo asks none (its stderr stays empty). The summary counts GPUs where a verdict is per GPU."""
    from email import message_from_bytes, policy

    p = run("slurm_gpueff.cli.gpueff", "demo", "--dir", "d", cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    assert "Summary (all demo jobs; SIMULATED DATA" in p.stdout
    monthly = p.stdout.split("The monthly summary the admins would get by mail", 1)[1]
    banner = "*** SIMULATED DATA \u2014 figures from simulated GPUs, not real ones ***"
    assert monthly.split("\n\n", 1)[1].startswith(banner + "\nGPU-hour summary for "), monthly[:400]
    (eml,) = (tmp_path / "d" / "reports" / "dry-run" / "monthly").rglob("site/message.eml")
    msg = message_from_bytes(eml.read_bytes(), policy=policy.default)
    assert msg["Subject"].startswith("[demo] SIMULATED DATA: GPU-hours "), msg["Subject"]
    html = msg.get_body(("html",)).get_content()
    assert banner.strip("* ") in html and "<title>SIMULATED DATA: GPU-hour summary" in html
    assert msg.get_body(("plain",)).get_content().startswith(banner)
    for account in (tmp_path / "d" / "reports" / "dry-run" / "monthly").rglob("message.eml"):  # each account's too
        assert "SIMULATED DATA" in message_from_bytes(account.read_bytes(), policy=policy.default)["Subject"]
    # Verdicts are per GPU: job 4209 used its first GPU fully; its other three never ran a kernel.
    assert "  GPU never used:                4 GPUs    2 jobs    15.50 GPU-h, 15.50 lost\n" in monthly, monthly
    assert "  Healthy:                       2 GPUs    1 job     12.00 GPU-h, 2.17 lost\n" in monthly
    assert "  No problem found:              1 GPU     1 job      4.00 GPU-h, 0.694 lost\n" in monthly
    assert "1. GPU never used: 15.50 GPU-hours lost on 4 GPUs in 2 jobs by 2 users." in monthly


def test_demo_refuses_to_wipe_a_folder_it_did_not_make(tmp_path):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "thesis.tex").write_text("do not delete")
    p = run("slurm_gpueff.cli.gpueff", "demo", "--dir", str(target), cwd=str(tmp_path))
    assert p.returncode != 0
    assert "was not made by the demo" in (p.stderr + p.stdout)
    assert (target / "thesis.tex").read_text() == "do not delete"


def test_demo_can_run_twice(tmp_path):
    assert run("slurm_gpueff.cli.gpueff", "demo", "--dir", "d", cwd=str(tmp_path)).returncode == 0
    p = run("slurm_gpueff.cli.gpueff", "demo", "--dir", "d", cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "ingested 9 spool records" in p.stdout


def test_demo_dir_that_cannot_be_a_folder_is_one_line_exit_2(tmp_path):
    """A regular file (or a file on the way) as --dir, or a path the database URL cannot name: one line, exit 2."""
    (tmp_path / "afile").write_text("keep me")
    for target in ("afile", "afile/sub", "a?b"):
        p = run("slurm_gpueff.cli.gpueff", "demo", "--dir", target, cwd=str(tmp_path))
        assert p.returncode == 2 and p.stdout == "", (target, p.stdout, p.stderr)
        assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("gpueff: "), p.stderr
        assert "Traceback" not in p.stderr
    assert (tmp_path / "afile").read_text() == "keep me"


def test_demo_folder_with_quotes_and_backslashes_in_its_name(tmp_path):
    """The demo writes its folder's path into its TOML config: a quote or a backslash must not break it."""
    p = run("slurm_gpueff.cli.gpueff", "demo", "--dir", 'my "demo" \\ dir', cwd=str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "ingested 9 spool records" in p.stdout and "quarantined 0, failed 0" in p.stdout
    assert (tmp_path / 'my "demo" \\ dir' / "gpueff.db").is_file()


def test_demo_folder_is_never_a_link_nor_another_users(tmp_path):
    """Run by root in a shared directory, ``gpueff demo --dir`` must not follow a symbolic link (to the folder,
    or planted in it as the config it writes) nor wipe a folder that only looks like the demo's: another user's
    folder with the demo's marker file. Each is one line, exit 2, and the files stay as they were. The folder's
    owner is the ordinary user gpuser where the test runs as root (skipped otherwise)."""
    from slurm_gpueff.cli.common import UsageError
    from slurm_gpueff.cli.demo import MARKER, prepare

    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("do not delete")
    (tmp_path / "link").symlink_to(tmp_path / "precious")
    with pytest.raises(UsageError, match="is a symbolic link: not followed"):
        prepare(str(tmp_path / "link"))
    planted = tmp_path / "planted"  # the demo's own folder, its marker a link to someone's file
    planted.mkdir()
    (planted / MARKER).symlink_to(tmp_path / "precious" / "thesis.tex")
    with pytest.raises(UsageError, match="was not made by the demo run as you"):
        prepare(str(planted))
    assert (tmp_path / "precious" / "thesis.tex").read_text() == "do not delete" and (planted / MARKER).is_symlink()
    if os.geteuid() == 0 and subprocess.run(["id", "gpuser"], capture_output=True).returncode == 0:
        import pwd

        uid = pwd.getpwnam("gpuser").pw_uid
        theirs = tmp_path / "theirs"
        theirs.mkdir()
        (theirs / MARKER).write_text("made by gpueff demo; safe to delete\n")
        (theirs / "thesis.tex").write_text("gpuser's")
        for p in (theirs, theirs / MARKER, theirs / "thesis.tex"):
            os.chown(p, uid, uid)
        with pytest.raises(UsageError, match="was not made by the demo run as you"):
            prepare(str(theirs))
        assert (theirs / "thesis.tex").read_text() == "gpuser's"
        empty = tmp_path / "empty-theirs"
        empty.mkdir()
        os.chown(empty, uid, uid)
        with pytest.raises(UsageError, match="is not yours"):
            prepare(str(empty))
    made = prepare(str(tmp_path / "fresh"))  # and a new folder is made as before
    assert pathlib.Path(made).read_text().startswith("# Written by `gpueff demo`")
    assert os.stat(tmp_path / "fresh").st_mode & 0o777 == 0o700
    assert prepare(str(tmp_path / "fresh")) == made  # its own folder is made again
