"""Account coordinators from sacctmgr (default research leads of the monthly summaries) and doctor's
ClusterName check, on sacctmgr / scontrol output captured from real Slurm 22.05, 24.11 and 26.05
(tests/data/slurmcmds/README.md). Those clusters have no coordinators; the output with coordinators
follows the documented format (same header, ``Coord Accounts`` a comma-separated list of accounts).
"""

from __future__ import annotations

import os

import pytest
from test_seff_rawid import install_fake

from slurm_gpueff.cli import doctor
from slurm_gpueff.config import Config
from slurm_gpueff.slurm.commands import SlurmCommandError, coordinators, parse_coordinators, parse_shard_counts
from slurm_gpueff.slurm.runner import SlurmRunner

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "slurmcmds")
VERSIONS = ("22.05.8", "24.11.5", "26.05.5")
HEADER = ("User|Def Acct|Admin|Coord Accounts|Cluster|Account|Partition|Share|Priority|MaxJobs|MaxNodes|MaxCPUs|"
          "MaxSubmit|MaxWall|MaxCPUMins|QOS|Def QOS")
WITH_COORDS = HEADER + """
alice|research|None||testcluster|research||1||||||||normal|
bob|physics|None|physics,vision|testcluster|physics||1||||||||normal|
bob|physics|None|physics,vision|testcluster|vision||1||||||||normal|
carol|vision|None|vision|testcluster|vision||1||||||||normal|
"""


def read(name: str) -> str:
    with open(os.path.join(DATA, name)) as fh:
        return fh.read()


@pytest.mark.parametrize("version", VERSIONS)
def test_real_sacctmgr_output_without_coordinators(version):
    text = read(f"sacctmgr-user-withassoc-withcoord-{version}.psv")
    assert text.startswith(HEADER + "\n")  # the same header in all three versions
    assert parse_coordinators(text) == {}


@pytest.mark.parametrize("version", ["24.11.5", "26.05.5"])
def test_real_sacctmgr_output_with_a_coordinator(version):
    """Captured after ``sacctmgr -i add coordinator account=research names=alice`` on the real cluster."""
    assert parse_coordinators(read(f"sacctmgr-user-withcoord-{version}.psv")) == {"research": ["alice"]}
    assert parse_coordinators(read(f"sacctmgr-user-withassoc-withcoord-coordinator-{version}.psv")) == {
        "research": ["alice"]}


def test_coordinators_per_account():
    assert parse_coordinators(WITH_COORDS) == {"physics": ["bob"], "vision": ["bob", "carol"]}
    assert parse_coordinators("") == {}
    with pytest.raises(SlurmCommandError, match="no User / Coord Accounts header"):
        parse_coordinators("sacctmgr: error: Problem talking to the database\n")


def test_coordinators_from_a_sacctmgr_process(tmp_path, monkeypatch):
    """sacctmgr found beside an absolute [sacct] command, run once; a failure says why."""
    install_fake(tmp_path / "slurm" / "bin", "sacctmgr")
    out = tmp_path / "sacctmgr.psv"
    out.write_text(WITH_COORDS)
    monkeypatch.setenv("FAKE_SACCTMGR_FILE", str(out))
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "calls"))
    sacct = str(tmp_path / "slurm" / "bin" / "sacct")
    assert coordinators(SlurmRunner(sacct), 5.0) == {"physics": ["bob"], "vision": ["bob", "carol"]}
    assert (tmp_path / "calls").read_text() == '["sacctmgr", "-P", "show", "user", "withcoord"]\n'
    monkeypatch.setenv("FAKE_SLURM_MODE", "fail")
    with pytest.raises(SlurmCommandError, match=r"sacctmgr failed \(exit 1\): .*Connection refused"):
        coordinators(SlurmRunner(sacct), 5.0)
    monkeypatch.setenv("FAKE_SLURM_MODE", "slow")
    with pytest.raises(SlurmCommandError, match="did not answer within 0.5 s"):
        coordinators(SlurmRunner(sacct), 0.5)


def scontrol(tmp_path, version: str) -> str:
    """A stand-in ``scontrol`` that prints the captured ``show config`` ClusterName line."""
    path = tmp_path / "bin" / "scontrol"
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\n/bin/cat '{DATA}/scontrol-show-config-clustername-{version}.txt'\n"
                    "echo 'Prolog                  = /usr/bin/gpueff-hook prolog'\n")
    path.chmod(0o755)
    return str(path.parent)


@pytest.mark.parametrize("version", VERSIONS)
def test_doctor_compares_site_cluster_with_clustername(tmp_path, monkeypatch, version):
    monkeypatch.setenv("PATH", scontrol(tmp_path, version))
    rep = doctor.Report()
    doctor.check_slurm(rep, Config({"site": {"cluster": "testcluster"}}))
    line = next(ln for ln in rep.lines if ln["check"] == "slurm ClusterName")
    assert line["status"] == "PASS" and "testcluster = site.cluster" in line["detail"]
    rep = doctor.Report()
    doctor.check_slurm(rep, Config({"site": {"cluster": "hpc1"}}))
    line = next(ln for ln in rep.lines if ln["check"] == "slurm ClusterName")
    assert line["status"] == "WARN"
    assert "'testcluster'" in line["detail"] and "'hpc1'" in line["detail"]
    assert "set site.cluster = 'testcluster'" in line["detail"]


def test_hook_keys_reads_every_slurm_generation_of_scontrol_show_config():
    """22.05/24.11 print ``Prolog = PATH``; 26.05 lists each script, ``Prolog[0] = PATH`` (seen on the test
    cluster), which doctor read as "not set"."""
    from slurm_gpueff.slurm.commands import hook_keys

    old = ["Prolog                  = /opt/slurm-gpueff/venv/bin/gpueff-prolog", "PrologFlags             = Alloc",
           "ClusterName             = c1", "PrologEpilogTimeout     = 60"]
    new = ["Epilog[0]               = /opt/e", "EpilogMsgTime           = 2000 usec",
           "Prolog[0]               = /opt/p", "Prolog[1]               = /opt/p2",
           "PrologFlags             = Alloc", "ResvProlog              = (null)"]
    assert hook_keys(old) == {"Prolog": "/opt/slurm-gpueff/venv/bin/gpueff-prolog", "PrologFlags": "Alloc",
                              "ClusterName": "c1"}
    assert hook_keys(new) == {"Epilog": "/opt/e", "Prolog": "/opt/p,/opt/p2", "PrologFlags": "Alloc"}


@pytest.mark.parametrize("version", VERSIONS)
def test_each_gpus_shard_count_from_scontrol_show_node(version):
    """Captured with a shard:3 job and a gpu:1 job running (4 GPUs of 4 shards): 24.11+ list each GPU's count in
    GresUsed (26.05 writes -/4 for the GPU given whole), 22.05 only the indexes in use, so its count is the
    configured total spread over the GPUs."""
    with open(os.path.join(DATA, f"scontrol-show-node-d-shards-{version}.txt")) as fh:
        assert parse_shard_counts(fh.read()) == {0: 4, 1: 4, 2: 4, 3: 4}
    assert parse_shard_counts("NodeName=n Gres=gpu:a100:4(S:0-1) GresUsed=gpu:a100:0(IDX:N/A)") == {}
    assert parse_shard_counts("NodeName=n Gres=gpu:3,shard:10 GresUsed=gpu:0(IDX:N/A),shard:0(IDX:N/A)") == {}
