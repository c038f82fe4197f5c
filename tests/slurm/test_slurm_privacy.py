"""Private by construction, on a real Slurm with its MUNGE: the job database is root's alone, and the users
read their jobs through ``gpueff serve``'s API, which learns who they are from a MUNGE credential.

Users (conftest.py): ``alice`` (a member of ``research``), ``bob`` (its lead in ``[leads]``),
``carol`` (its coordinator in Slurm's accounting), ``dave`` (in ``[privacy] admins``). Root runs one job in
``research`` and one in ``physics``. Nothing is mocked but the GPUs (the ``simulated`` backend).
"""

from __future__ import annotations

import json
import os
import pwd

import pytest

from .conftest import ACCOUNT, ADMIN, COORDINATOR, LEAD, OTHER_ACCOUNT, USER, SlurmCluster

pytestmark = pytest.mark.slurm

ECHO = "echo GPUS=$SLURM_JOB_GPUS; sleep 1"


@pytest.fixture(scope="module")
def private_jobs(slurm: SlurmCluster) -> dict[str, int]:
    c = slurm
    ids = {
        "alice": c.sbatch("--gres=gpu:1", "-J", "alice-gpu", "--wrap", ECHO, user=USER),
        "root": c.sbatch("--gres=gpu:1", "-J", "root-gpu", "--wrap", ECHO),
        "physics": c.sbatch("--gres=gpu:1", "-A", OTHER_ACCOUNT, "-J", "physics-gpu", "--wrap", ECHO),
    }
    c.wait_state(list(ids.values()))
    c.wait_node_idle()
    c.gpueff("ingest")
    c.wait_accounted(list(ids.values()))
    c.settle()
    c.gpueff("enrich", "--since", "now-1d")
    return ids


def _listed(table: str) -> set[int]:
    """The job ids in the first column of a ``seff-gpu -u/-A`` table."""
    return {int(line.split()[0]) for line in table.splitlines() if line.split() and line.split()[0].isdigit()}


def _ok(p) -> str:
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    return p.stdout


def test_the_database_is_root_s_alone(slurm, private_jobs):
    db = slurm.db_path
    assert os.stat(db).st_mode & 0o077 == 0, oct(os.stat(db).st_mode)
    assert os.stat(os.path.dirname(db)).st_mode & 0o077 == 0, oct(os.stat(os.path.dirname(db)).st_mode)
    for argv in (["cat", db], ["sqlite3", db, "SELECT count(*) FROM job"] if os.path.exists("/usr/bin/sqlite3")
                 else ["cat", db + "-wal"], [slurm.user_python, "-c",
                                             f"import sqlite3; sqlite3.connect('file:{db}?mode=ro', uri=True)"
                                             ".execute('select 1 from job')"]):
        p = slurm.run(argv, user=USER)
        assert p.returncode != 0, (argv, p.stdout)
        assert "ermission denied" in p.stderr or "unable to open" in p.stderr, (argv, p.stderr)


def test_alice_reads_her_card_through_the_service(slurm, private_jobs):
    ids = private_jobs
    out = _ok(slurm.seff(ids["alice"], user=USER))
    assert f"Job ID: {ids['alice']}" in out and f"User/Account: {USER}/{ACCOUNT}" in out
    doc = json.loads(_ok(slurm.seff(ids["alice"], "--json", user=USER)))
    assert doc["jobs"][0]["job"]["job_id"] == ids["alice"] and doc["jobs"][0]["job"]["user"] == USER
    html = os.path.join(slurm.out, f"card-{ids['alice']}.html")
    _ok(slurm.seff(ids["alice"], "--html", html, user=USER))
    assert pwd.getpwuid(os.stat(html).st_uid).pw_name == USER  # written by alice's own seff-gpu
    with open(html, encoding="utf-8") as fh:
        assert f"{ids['alice']}" in fh.read()
    table = _ok(slurm.seff(None, "-u", USER, user=USER))
    assert ids["alice"] in _listed(table) and ids["root"] not in _listed(table), table
    # root's job: refused where the data is, with the exit status seff-gpu documents
    p = slurm.seff(ids["root"], user=USER)
    assert p.returncode == 6 and p.stdout == "" and "belongs to another user" in p.stderr, (p.stdout, p.stderr)
    p = slurm.seff(None, "-u", "root", user=USER)
    assert p.returncode == 6, (p.stdout, p.stderr)
    p = slurm.seff(None, "-A", OTHER_ACCOUNT, user=USER)
    assert p.returncode == 6, (p.stdout, p.stderr)


@pytest.mark.parametrize("lead", [LEAD, COORDINATOR], ids=["config-lead", "slurm-coordinator"])
def test_a_lead_sees_their_account_and_no_other(slurm, private_jobs, lead):
    ids = private_jobs
    assert f"User/Account: {USER}/{ACCOUNT}" in _ok(slurm.seff(ids["alice"], user=lead))
    assert f"User/Account: root/{ACCOUNT}" in _ok(slurm.seff(ids["root"], user=lead))
    p = slurm.seff(ids["physics"], user=lead)
    assert p.returncode == 6 and p.stdout == "", (p.stdout, p.stderr)
    table = _ok(slurm.seff(None, "-A", ACCOUNT, user=lead))
    assert {ids["alice"], ids["root"]} <= _listed(table) and ids["physics"] not in _listed(table), table
    p = slurm.seff(None, "-A", OTHER_ACCOUNT, user=lead)
    assert p.returncode == 6, (p.stdout, p.stderr)


def test_an_admin_sees_every_job(slurm, private_jobs):
    out = _ok(slurm.seff(private_jobs["physics"], user=ADMIN))
    assert f"User/Account: root/{OTHER_ACCOUNT}" in out


def test_the_controllers_private_data_reads_as_none(slurm):
    """seff-gpu answers another user's job as Slurm's PrivateData says (access/privacy.py): "not yours" (exit 6,
    the tests above) where it does not hide jobs. These clusters set no PrivateData: the real ``scontrol show
    config`` of each version prints a line that reads as no flags, not as a failure (which would hide jobs)."""
    from slurm_gpueff.slurm.commands import parse_private_data

    p = slurm.run(["scontrol", "show", "config"], check=True)
    assert parse_private_data(p.stdout) == frozenset(), [ln for ln in p.stdout.splitlines() if "Private" in ln]
