"""Fault injection: whatever breaks, a hook exits 0 within its bound and the job's record survives.

Every fault is real: a missing agent, a spool path under a regular file (root ignores permission bits),
a FIFO that blocks the collector's read, a broken config file, a config path that is a directory, a FIFO,
unreadable or not UTF-8, a lost Prolog state, a bad job id.
The GPUs are the simulated backend's or absent (no GPU on this machine).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

import pytest
from hooksite import HOOKS, ROOT, HookSite

from slurm_gpueff import hook, jobstate, record, spool
from slurm_gpueff.config import Config

MARGIN_S = 3.0  # interpreter start-up and exit on a loaded 2-core CI machine
pytestmark = pytest.mark.process  # its tests start real processes (CLI commands, hooks, services)


# ``site``: a throwaway node (HookSite), the fixture in conftest.py


def _assert_allocation_only(rec: dict) -> None:
    assert rec["gpus"], "the allocated GPUs must still be listed"
    for g in rec["gpus"]:
        assert all(g[m] is None for m in record.METRICS), "unmeasured figures must be None, never 0"
        assert g["samples"] == 0 and g["missing"]


def test_nvml_backend_without_agent_gives_allocation_only_record(tmp_path):
    site = HookSite(str(tmp_path), backend="nvml")
    for kind in ("prolog", "epilog"):
        p, wall = site.run(kind, 501)
        assert p.returncode == 0 and wall < 10 + MARGIN_S
    rec = record.validate(site.record(501))
    _assert_allocation_only(rec)
    assert "agent" in rec["reason"].lower() or "nvml" in rec["reason"].lower()
    assert not os.path.exists(site.state_file(501))


def _block_spool(site: HookSite) -> None:
    """Make the spool unwritable even for root: its parent is a regular file (ENOTDIR)."""
    blocker = os.path.join(site.base, "not-a-dir")
    with open(blocker, "w") as fh:
        fh.write("x")
    site.spool_ok = site.spool
    site.write_config(paths={"spool_dir": os.path.join(blocker, "spool"), "state_dir": site.state})


def test_unwritable_spool_falls_back_and_is_drained_by_the_next_job(site):
    _block_spool(site)
    site.run("prolog", 601)
    p, _ = site.run("epilog", 601)
    assert p.returncode == 0
    assert "not writable" in p.stderr and "spool-fallback" in p.stderr  # logged loudly
    fallback = os.path.join(site.state, "spool-fallback")
    assert oct(os.stat(fallback).st_mode & 0o777) == "0o700"
    rec = site.record(601, spool=fallback)
    assert rec["job_id"] == 601 and rec["gpus"][0]["sm_active"] is not None

    site.write_config()  # the admin fixes the spool; the next job end moves the stranded record back
    site.run("prolog", 602)
    p, _ = site.run("epilog", 602)
    assert p.returncode == 0 and "moved 1 record" in p.stderr
    assert [os.path.basename(f) for f in site.incoming()] == ["job-601-node01.json", "job-602-node01.json"]
    assert site.incoming(fallback) == []
    assert site.record(601) == rec


def test_spool_and_state_dir_unwritable_fall_back_to_tmpdir(site):
    blocker = os.path.join(site.base, "file")
    with open(blocker, "w") as fh:
        fh.write("x")
    site.write_config(paths={"spool_dir": os.path.join(blocker, "spool"),
                             "state_dir": os.path.join(blocker, "state")})
    p1, _ = site.run("prolog", 701)
    p2, _ = site.run("epilog", 701)
    assert p1.returncode == p2.returncode == 0
    assert "cannot save the job state" in p1.stderr
    tmp_spool = os.path.join(site.tmpdir, spool.FALLBACK_NAME)
    rec = site.record(701, spool=tmp_spool)
    assert rec["start_time"] is None and "Prolog state" in rec["reason"]
    assert "start time unknown" in rec["reason"]


def test_fallback_in_shared_tmp_refuses_a_directory_owned_by_someone_else(site):
    """A world-writable /tmp could hold an attacker's directory: it is refused, not used."""
    planted = os.path.join(site.tmpdir, spool.FALLBACK_NAME)
    os.makedirs(planted)
    os.chmod(planted, 0o777)
    assert not spool.private_dir(planted, create=True)


def _make_fifo(site: HookSite, job_id: int) -> None:
    """A FIFO where the simulated collector reads the job's profile: open() blocks (a real hang)."""
    os.makedirs(os.path.join(site.state, "sim"), exist_ok=True)
    os.mkfifo(os.path.join(site.state, "sim", f"{job_id}.profile"))


def test_epilog_bounded_when_collector_hangs(site):
    site.write_config(collector={"hook_timeout_s": 2.0})
    site.run("prolog", 801)
    with open(site.state_file(801)) as fh:  # a start state that names no profile: the Epilog reads the FIFO
        saved = json.load(fh)
    saved["start"].pop("profile")
    jobstate.save(site.state_file(801), saved)
    _make_fifo(site, 801)
    p, wall = site.run("epilog", 801, timeout=30)
    assert p.returncode == 0
    assert wall < 2.0 + MARGIN_S, f"epilog took {wall:.1f} s, bound is 2 s"
    rec = record.validate(site.record(801))
    _assert_allocation_only(rec)
    assert rec["backend"] == "none"
    assert "collector timed out after 1.5 s" in rec["reason"]
    assert rec["gpus"][0]["missing"]["sm_active"] == "collector timed out after 1.5 s"


def test_prolog_bounded_when_collector_hangs(site):
    site.write_config(collector={"hook_timeout_s": 2.0})
    _make_fifo(site, 802)
    p, wall = site.run("prolog", 802, timeout=30)
    assert p.returncode == 0 and wall < 2.0 + MARGIN_S
    with open(site.state_file(802)) as fh:
        saved = json.load(fh)
    assert saved["start"] is None and "timed out" in saved["reason"] and saved["start_time"] > 0
    os.unlink(os.path.join(site.state, "sim", "802.profile"))
    site.run("epilog", 802)
    rec = site.record(802)
    assert rec["start_time"] == saved["start_time"] and "at job start: collector timed out" in rec["reason"]


def test_config_with_bad_values_keeps_the_valid_settings(site):
    site.write_config(text=f'[paths]\nspool_dir = "{site.spool}"\nstate_dir = "{site.state}"\n'
                           '[collector]\nbackend = "bogus"\nhook_timeout_s = -1\n[nonsense]\nx = 1\n')
    for kind in ("prolog", "epilog"):
        p, _ = site.run(kind, 901)
        assert p.returncode == 0 and "config problem" in p.stderr
    rec = record.validate(site.record(901))
    assert "config problem" in rec["reason"] and "unknown section [nonsense]" in rec["reason"]
    assert rec["backend"] == "none"  # backend "bogus" dropped: auto, no agent here -> allocation-only


def test_unparseable_or_missing_config_falls_back_to_defaults(site, tmp_path):
    site.write_config(text="[paths\nspool_dir = ")
    log = hook.HookLog("epilog")
    cfg, problem = hook.read_config(site.config_path, {}, log)
    assert "not valid TOML" in problem and cfg.as_dict() == Config().as_dict()
    cfg, problem = hook.read_config(str(tmp_path / "absent.toml"), {}, log)
    assert "does not exist" in problem and cfg.paths.spool_dir == Config().paths.spool_dir
    assert any("config problem" in line for line in log.lines)


def test_missing_prolog_state_records_unknown_start(site):
    p, _ = site.run("epilog", 1001)
    assert p.returncode == 0
    rec = record.validate(site.record(1001))
    assert rec["start_time"] is None and "no Prolog state" in rec["reason"]
    assert "start time unknown" in rec["reason"]
    # without the Prolog's start state nothing was measured: every figure None with why, never a made-up one
    assert all(rec["gpus"][0][m] is None for m in record.METRICS)
    assert rec["gpus"][0]["missing"]["kernel_active"].startswith("no start state")

    site.run("epilog", 1002, SLURM_JOB_START_TIME="1700000000")
    rec = site.record(1002)
    assert rec["start_time"] == 1700000000 and "SLURM_JOB_START_TIME" in rec["reason"]


def test_corrupt_prolog_state_is_reported_not_fatal(site):
    os.makedirs(os.path.join(site.state, "jobs"))
    with open(site.state_file(1003), "w") as fh:
        fh.write('{"start": {"profile": "idle"}, "start_ti')
    p, _ = site.run("epilog", 1003)
    assert p.returncode == 0
    rec = site.record(1003)
    assert "unreadable" in rec["reason"] and rec["start_time"] is None
    assert not os.path.exists(site.state_file(1003))



def test_unstorable_start_state_is_dropped_with_the_reason(tmp_path):
    """A collector start state JSON cannot hold (NaN) must not cost the job its start time."""
    path = str(tmp_path / "jobs" / "5.json")
    for reason, expected in ((None, "collector start state not storable"),
                             ("collector timed out", "collector timed out; collector start state not storable")):
        jobstate.save(path, {"start": {"sm": float("nan")}, "start_time": 1.7e9, "gpus": [0], "reason": reason})
        saved, problem = jobstate.load(path)
        assert problem is None and saved["start"] is None and saved["start_time"] == 1.7e9
        assert saved["reason"].startswith(expected)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"

@pytest.mark.parametrize("job_id", ["abc", "0", "", "-5"])
def test_bad_job_id_keeps_the_environment_in_quarantine(site, job_id):
    p, _ = site.run("prolog", job_id)
    assert p.returncode == 0 and "cannot identify the job" in p.stderr
    p, _ = site.run("epilog", job_id)
    assert p.returncode == 0
    assert site.incoming() == []
    qdir = os.path.join(site.spool, "quarantine")
    kept = [n for n in os.listdir(qdir) if n.endswith(".json")]
    assert len(kept) == 1
    with open(os.path.join(qdir, kept[0])) as fh:
        snap = json.load(fh)
    with open(os.path.join(qdir, kept[0] + ".error")) as fh:
        error = fh.read()
    assert "SLURM_JOB_ID" in error and snap["env"]["SLURM_JOB_ID"] == job_id
    assert snap["env"]["SLURM_JOB_GPUS"] == "0,1"



def test_internal_error_in_the_epilog_keeps_the_environment_in_quarantine(site, monkeypatch):
    """A bug of ours mid-Epilog: still exit 0, and the job's environment is kept for a person."""
    def broken(self, cfg, job_id):  # noqa: ANN001, ANN202
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(hook.HookRun, "epilog", broken)
    assert hook.run("epilog", site.env(1102)) == 0
    qdir = os.path.join(site.spool, "quarantine")
    kept = [n for n in os.listdir(qdir) if n.endswith(".json")]
    with open(os.path.join(qdir, kept[0])) as fh:
        assert json.load(fh)["env"]["SLURM_JOB_ID"] == "1102"
    with open(os.path.join(qdir, kept[0] + ".error")) as fh:
        assert fh.read() == "epilog internal error: ZeroDivisionError: a bug\n"

def test_invalid_measurement_is_replaced_by_allocation_only(site):
    """An unknown simulated profile is measured as nothing, with the reason: still a valid record."""
    site.write_config(simulated={"profile": "no-such-profile"})
    site.run("prolog", 1101)
    p, _ = site.run("epilog", 1101)
    assert p.returncode == 0
    rec = record.validate(site.record(1101))
    _assert_allocation_only(rec)
    assert "unknown simulated profile" in rec["reason"]


def test_unserialisable_measurement_is_caught_before_the_spool():
    """NaN in a timeline passes the field checks but not JSON: the hook must notice, not crash."""
    from hooksite import make_record

    rec = make_record(5)
    rec["gpus"][0]["timeline"] = [[1.0, float("nan"), 0.1, 0.0]]
    data, problem = record.serialise(rec)
    assert data is None and "invalid measurement" in problem
    rec["gpus"][0]["timeline"] = []
    data, problem = record.serialise(rec)
    assert problem is None and json.loads(data)["job_id"] == 5


def test_drain_never_clobbers_a_newer_record(site):
    """A stranded fallback copy of a job whose newer record is already spooled goes to quarantine."""
    from hooksite import make_record

    from slurm_gpueff import spool

    cfg = hook.read_config(site.config_path, {}, hook.HookLog("epilog"))[0]
    env = {"TMPDIR": site.tmpdir}
    fallback = spool.spool_dirs(cfg, env)[1]
    assert spool.private_dir(fallback, create=True)
    spool.write_record(fallback, make_record(9, user="old"))
    spool.write_record(fallback, make_record(10))
    spool.write_record(site.spool, make_record(9, user="new"))
    assert spool.drain_fallbacks(cfg, env, hook.HookLog("epilog")) == 2
    assert site.record(9)["user"] == "new" and site.record(10)["job_id"] == 10
    q = os.path.join(site.spool, "quarantine", "fallback-job-9-node01.json")
    with open(q) as fh:
        assert json.load(fh)["user"] == "old"
    assert os.path.exists(q + ".error") and site.incoming(fallback) == []


# --------------------------------------------------------------------------------------------------
# A config path the hooks cannot read: they run with the defaults and still write the record in time.
DEFAULT_BOUND_S = 10.0  # collector.hook_timeout_s when the config cannot be read


@pytest.fixture(scope="module")
def unprivileged():
    """(tree, hooks dir, python, user): the hooks run as user ``nobody`` when we are root.

    As root, a mode-000 file is still readable, and the defaults' spool and state dirs (/var/spool,
    /run) would be written for real. As ``nobody`` the read fails and those dirs are not writable, so the
    record lands in $TMPDIR's fallback spool inside ``tree``. The tree (a copy of the hooks and the
    package) sits in /tmp, since pytest's own temp dirs are closed to other users.
    """
    user = "nobody" if os.geteuid() == 0 else None
    if user is not None:
        try:
            pwd.getpwnam(user)
        except KeyError:
            pytest.skip("no user nobody to run the hooks as")
    tree = tempfile.mkdtemp(prefix="gpueff-hookcfg-")
    os.chmod(tree, 0o755)
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(os.path.join(ROOT, "slurm_gpueff"), os.path.join(tree, "src", "slurm_gpueff"), ignore=ignore)
    shutil.copytree(HOOKS, os.path.join(tree, "src", "hooks"), ignore=ignore)
    as_user = {} if user is None else {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}
    python = None
    for exe in dict.fromkeys([sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"]):
        try:
            if subprocess.run([exe, "-c", "import sys; sys.exit(sys.version_info < (3, 11))"], cwd=tree,
                              capture_output=True, timeout=60, **as_user).returncode == 0:
                python = exe
                break
        except OSError:
            continue
    if python is None:
        shutil.rmtree(tree)
        pytest.skip(f"no Python >= 3.11 that {user} can run")
    yield tree, os.path.join(tree, "src", "hooks"), python, user
    shutil.rmtree(tree)


@pytest.mark.parametrize("fault", ["directory", "unreadable", "not-utf8", "fifo"])
def test_unusable_config_path_still_records_the_job_within_the_bound(unprivileged, fault):
    tree, hooks, python, user = unprivileged
    site = HookSite(os.path.join(tree, fault))
    if user is not None:
        pw = pwd.getpwnam(user)
        for d in (site.tmpdir, site.logdir):
            os.chown(d, pw.pw_uid, pw.pw_gid)
    bad = os.path.join(site.base, "bad.toml")
    if fault == "directory":
        os.mkdir(bad)
    elif fault == "unreadable":
        with open(site.config_path) as src, open(bad, "w") as dst:
            dst.write(src.read())
        os.chmod(bad, 0)
    elif fault == "not-utf8":
        with open(bad, "wb") as fh:
            fh.write(b'[site]\ncluster = "caf\xe9"\n')
    else:
        os.mkfifo(bad)
    env = site.env(1201, GPUEFF_CONFIG=bad)
    for kind in ("prolog", "epilog"):
        p, wall = site.run(kind, 1201, env=dict(env), hooks=hooks, python=python, user=user, timeout=60)
        assert p.returncode == 0, (kind, p.stderr)
        assert wall < DEFAULT_BOUND_S + MARGIN_S, f"{fault}: {kind} took {wall:.1f} s"
        assert "config problem" in p.stderr and bad in p.stderr, (kind, p.stderr)
    rec = record.validate(site.record(1201, spool=os.path.join(site.tmpdir, spool.FALLBACK_NAME)))
    assert rec["job_id"] == 1201 and rec["cluster"] == "testc"
    _assert_allocation_only(rec)
    assert "config problem" in rec["reason"] and bad in rec["reason"] and "defaults" in rec["reason"]
