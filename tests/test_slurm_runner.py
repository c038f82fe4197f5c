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
from slurm_gpueff.slurm.runner import LIST_ARG_BYTES, SlurmRunner, id_chunks

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


def test_a_list_of_ids_is_split_into_arguments_linux_starts(tmp_path):
    """id_chunks: every id once, in order; no piece over its byte bound or id count; run_list runs each piece."""
    ids = list(range(10_000_000, 10_050_000))
    pieces = id_chunks(ids)
    assert [int(i) for p in pieces for i in p.split(",")] == ids
    assert all(len(p.encode()) <= LIST_ARG_BYTES for p in pieces) and len(pieces) == 14
    assert [len(p.split(",")) for p in id_chunks(range(1, 1201), most=500)] == [500, 500, 200]
    assert id_chunks([]) == [] and id_chunks(["x" * 40_000, "1"]) == ["x" * 40_000, "1"]
    echo = script(tmp_path, "squeue", 'echo "$#:$3"')
    runner = SlurmRunner(os.path.join(tmp_path, "sacct"))
    assert os.path.dirname(echo) == str(tmp_path)
    out = runner.run_list("squeue", ["-h", "-j"], range(1, 8001), ["-O", "JobID"], 5, most=3000)
    assert [o.split(":")[0] for o in out] == ["5", "5", "5"] and runner.calls == 3
    assert [len(o.strip().split(":")[1].split(",")) for o in out] == [3000, 3000, 2000]


def test_output_is_text_with_text_modes_line_ends_and_never_a_decoding_error(tmp_path):
    script(tmp_path, "squeue", r"printf 'a\r\nb\rc\n\377d\n'")
    assert SlurmRunner(os.path.join(tmp_path, "sacct")).run("squeue", [], 5) == "a\nb\nc\n\ufffdd\n"


def test_output_past_the_limit_is_refused(tmp_path, monkeypatch):
    import slurm_gpueff.slurm.runner as runner_module

    monkeypatch.setattr(runner_module, "OUTPUT_LIMIT", 1000)
    script(tmp_path, "squeue", "head -c 5000 /dev/zero")
    with pytest.raises(SlurmCommandError) as exc:
        SlurmRunner(os.path.join(tmp_path, "sacct")).run("squeue", [], 5)
    assert exc.value.why == "too much output" and "5,000 bytes" in str(exc.value)
