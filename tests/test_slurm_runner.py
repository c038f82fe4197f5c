"""The one runner of Slurm's client commands (slurm_gpueff/slurm/runner.py): where it finds them, its time
limit, its environment and its one error type. The commands here are small shell scripts standing in for
Slurm's (their arguments and output are what matter to the runner); the real commands of Slurm 22.05, 24.11
and 26.05 go through the same runner in tests/slurm/."""

from __future__ import annotations

import logging
import os
import time

import pytest

from slurm_gpueff.errors import SlurmCommandError
from slurm_gpueff.slurm.runner import SlurmRunner

pytestmark = pytest.mark.process  # the runner starts the stand-in Slurm commands


def script(d, name: str, body: str) -> str:
    path = os.path.join(str(d), name)
    with open(path, "w") as fh:
        fh.write("#!/bin/sh\n" + body + "\n")
    os.chmod(path, 0o755)
    return path


def test_commands_beside_an_absolute_sacct_then_on_path(tmp_path, monkeypatch):
    site = tmp_path / "opt-slurm-bin"
    site.mkdir()
    other = tmp_path / "path"
    other.mkdir()
    sacct = script(site, "sacct", "echo sacct")
    script(site, "squeue", "echo site-squeue")
    script(other, "squeue", "echo path-squeue")
    script(other, "scancel", "echo path-scancel")
    monkeypatch.setenv("PATH", f"{other}:/usr/bin:/bin")
    slurm = SlurmRunner(sacct)
    assert slurm.run("squeue", [], 5) == "site-squeue\n"  # beside the configured sacct wins
    assert slurm.run("scancel", [], 5) == "path-scancel\n"  # not there: PATH
    assert SlurmRunner("sacct").path("squeue") == str(other / "squeue")
    assert slurm.calls == 2


def test_failures_are_one_error_type_saying_why(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # only the stand-ins: this machine may have Slurm's own
    slurm = SlurmRunner("sacct")
    with pytest.raises(SlurmCommandError) as missing:
        slurm.run("sacct", ["-j", "1"], 5)
    assert missing.value.why == "missing" and str(missing.value).startswith("sacct not found")
    script(tmp_path, "scontrol", "echo 'scontrol: error: Invalid job id specified' >&2; exit 1")
    with pytest.raises(SlurmCommandError) as failed:
        slurm.run("scontrol", ["update", "JobId=9"], 5)
    assert failed.value.why == "failed" and failed.value.returncode == 1
    assert str(failed.value) == "scontrol failed (exit 1): scontrol: error: Invalid job id specified"
    script(tmp_path, "squeue", "exec /bin/sleep 30")
    t0 = time.monotonic()
    with pytest.raises(SlurmCommandError) as slow:
        slurm.run("squeue", [], 0.5)
    assert slow.value.why == "timeout" and time.monotonic() - t0 < 5
    with open(tmp_path / "scancel", "w") as fh:
        fh.write("not a program")
    os.chmod(tmp_path / "scancel", 0o755)
    with pytest.raises(SlurmCommandError) as unrunnable:
        slurm.run("scancel", ["9"], 5)
    assert unrunnable.value.why == "unrunnable" and str(unrunnable.value).startswith("cannot run ")


def test_time_format_is_the_runners_choice_and_calls_are_logged(tmp_path, monkeypatch, caplog):
    sacct = script(tmp_path, "sacct", 'echo "[$SLURM_TIME_FORMAT]"')
    monkeypatch.setenv("SLURM_TIME_FORMAT", "relative")  # a user's setting changes what sacct prints
    slurm = SlurmRunner(sacct)
    with caplog.at_level(logging.DEBUG, logger="slurm_gpueff.slurm"):
        assert slurm.run("sacct", ["--json"], 5) == "[]\n"
        assert slurm.run("sacct", ["-P"], 5, epoch_times=True) == "[%s]\n"
    assert sum(sacct in r.getMessage() and "exit 0" in r.getMessage() for r in caplog.records) == 2
