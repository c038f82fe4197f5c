"""The Slurm hooks on the normal path: real subprocesses with slurmd's environment (no PATH, no HOME).

The GPUs are the simulated backend's (no GPU here); everything else is real: config file, state files,
spool, interpreter start-up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hooksite import HOOKS, ROOT, HookSite

from slurm_gpueff import hook, record
from slurm_gpueff.cli import hook_install
from slurm_gpueff.slurm import hookenv

# ``site``: a throwaway node (HookSite), the fixture in conftest.py


@pytest.mark.process
def test_prolog_then_epilog_spools_a_valid_record(site):
    p, _ = site.run("prolog", 4242)
    assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
    with open(site.state_file(4242)) as fh:
        saved = json.load(fh)
    assert saved["gpus"] == [0, 1] and saved["backend"] == "simulated" and saved["start"]["profile"]
    assert oct(os.stat(site.state_file(4242)).st_mode & 0o777) == "0o600"

    p, _ = site.run("epilog", 4242, SLURM_JOB_EXIT_CODE2="3:0", SLURM_JOB_EXIT_CODE="768")
    assert (p.returncode, p.stderr) == (0, "")
    assert not os.path.exists(site.state_file(4242)), "epilog must remove the job state"
    rec = record.validate(site.record(4242))
    assert rec["job_id"] == 4242 and rec["node"] == "node01" and rec["cluster"] == "testc"
    assert (rec["user"], rec["uid"], rec["partition"], rec["account"]) == ("alice", 1000, "gpu", None)
    assert (rec["exit_code"], rec["signal"]) == (3, 0)
    assert rec["start_time"] == saved["start_time"] <= rec["end_time"]
    assert rec["backend"] == "simulated" and rec["reason"] is None
    assert [g["index"] for g in rec["gpus"]] == [0, 1]
    assert all(g["sm_active"] is not None and g["source"] == "simulated" for g in rec["gpus"])
    assert rec["writer"].startswith("slurm-gpueff ")
    assert oct(os.stat(site.incoming()[0]).st_mode & 0o777) == "0o600"


@pytest.mark.process
def test_sim_now_sets_the_clock_for_the_simulated_backend_only(tmp_path):
    sim = HookSite(str(tmp_path / "sim"))
    sim.run("prolog", 7, GPUEFF_SIM_NOW="1700000000")
    sim.run("epilog", 7, GPUEFF_SIM_NOW="1700007200")
    rec = sim.record(7)
    assert (rec["start_time"], rec["end_time"]) == (1700000000.0, 1700007200.0)
    assert rec["gpus"][0]["energy_j"] == pytest.approx(rec["gpus"][0]["power_mean_w"] * 7200, rel=1e-3)

    real = HookSite(str(tmp_path / "none"), backend="none")
    real.run("prolog", 8, GPUEFF_SIM_NOW="1700000000")
    real.run("epilog", 8, GPUEFF_SIM_NOW="1700007200")
    rec = real.record(8)
    assert rec["start_time"] > 1.75e9 and rec["end_time"] > 1.75e9, "GPUEFF_SIM_NOW leaked into real clock"
    assert rec["backend"] == "none" and "backend = none" in rec["reason"]
    assert all(g[m] is None for g in rec["gpus"] for m in record.METRICS)


@pytest.mark.process
def test_cpu_only_job_costs_nothing_and_writes_nothing(site):
    site.write_config(text="this is [not toml")  # proves the config is not even read
    for kind in ("prolog", "epilog"):
        p, _ = site.run(kind, 99, gpus=None)
        assert (p.returncode, p.stdout, p.stderr) == (0, "", ""), kind
    assert not os.path.exists(site.state) and not os.path.exists(site.spool)


@pytest.mark.process
def test_gpus_fall_back_to_cuda_visible_devices(site):
    env = site.env(55, gpus=None, CUDA_VISIBLE_DEVICES="2,3")
    site.run("prolog", 55, env=dict(env))
    site.run("epilog", 55, env=dict(env))
    assert [g["index"] for g in site.record(55)["gpus"]] == [2, 3]


@pytest.mark.process
def test_mig_uuid_gpu_list_records_the_slice(site):
    """A MIG UUID allocation (no index list): the slice is recorded under its position, by MIG UUID."""
    env = site.env(56, gpus="MIG-1b2c3d4e-aaaa-bbbb-cccc-0123456789ab")
    site.run("prolog", 56, env=dict(env))
    site.run("epilog", 56, env=dict(env))
    rec = site.record(56)
    assert [(g["index"], g["mig_uuid"]) for g in rec["gpus"]] == [(0, "MIG-1b2c3d4e-aaaa-bbbb-cccc-0123456789ab")]


@pytest.mark.process
def test_unreadable_gpu_list_still_records_the_job(site):
    """Junk in the GPU list: the job is recorded, with no GPUs and the reason."""
    env = site.env(57, gpus="gpu-a,gpu-b")
    site.run("prolog", 57, env=dict(env))
    site.run("epilog", 57, env=dict(env))
    rec = site.record(57)
    assert rec["gpus"] == [] and rec["reason"] == (
        "SLURM_JOB_GPUS='gpu-a,gpu-b' could not be read as GPU indexes ('gpu-a' is not an index from 0 to 1023 "
        "or a MIG UUID); the GPUs were not measured")


@pytest.mark.parametrize("env, expected", [
    ({"SLURM_JOB_EXIT_CODE2": "3:0", "SLURM_JOB_EXIT_CODE": "768"}, (3, 0)),
    ({"SLURM_JOB_EXIT_CODE": "768"}, (3, 0)),
    ({"SLURM_JOB_EXIT_CODE": "9"}, (0, 9)),
    ({"SLURM_JOB_EXIT_CODE2": "0:15"}, (0, 15)),
    ({"SLURM_JOB_EXIT_CODE2": "junk", "SLURM_JOB_EXIT_CODE": "256"}, (1, 0)),
    ({}, (None, None)),
])
def test_exit_code_and_signal(env, expected):
    assert hookenv.parse_exit(env) == expected


def test_env_parsing_keeps_problems_as_sentences():
    h = hookenv.parse({"SLURM_JOB_ID": "12x", "SLURM_JOB_UID": "-1", "SLURM_JOB_GPUS": "1,0,1",
                        "SLURM_JOB_ACCOUNT": "", "SLURMD_NODENAME": "gpu7"})
    assert h.job_id is None and h.uid is None and h.account is None and h.node == "gpu7"
    assert h.gpu_indexes == [0, 1] and h.gpu_var == "SLURM_JOB_GPUS"
    assert any("SLURM_JOB_ID='12x'" in p for p in h.problems)
    assert any("SLURM_JOB_UID" in p for p in h.problems)


@pytest.mark.process
def test_checkout_hooks_run_by_their_shebang_without_path(site, tmp_path):
    """slurmd execs the file itself with no PATH: the shebang must be absolute and work."""
    with open(os.path.join(HOOKS, "prolog")) as fh:
        shebang = fh.readline()
    assert shebang.startswith("#!/") and "env" not in shebang
    interp = shebang[2:].split()[0]
    if not os.path.exists(interp):  # the documented alternative must then work: install_hooks
        interp = sys.executable
    ok = subprocess.run([interp, "-c", "import sys; print(sys.version_info >= (3, 11))"],
                        capture_output=True, text=True).stdout.strip() == "True"
    hooks_dir = HOOKS if ok and interp != sys.executable else hook_install.install_hooks(str(tmp_path / "inst"))[0]
    hooks_dir = os.path.dirname(hooks_dir) if hooks_dir != HOOKS else HOOKS
    env = site.env(31)
    for kind in ("prolog", "epilog"):
        p = subprocess.run([os.path.join(hooks_dir, kind)], env=env, cwd=site.logdir, capture_output=True,
                           text=True, timeout=60)
        assert (p.returncode, p.stderr) == (0, ""), (kind, p.stderr)
    assert record.validate(site.record(31))["start_time"] is not None


@pytest.mark.process
def test_install_hooks_writes_absolute_shebang_scripts(site, tmp_path):
    paths = hook_install.install_hooks(str(tmp_path / "bin"))
    assert [os.path.basename(p) for p in paths] == ["prolog", "epilog"]
    for p in paths:
        with open(p) as fh:
            assert fh.readline().strip() == f"#!{sys.executable}"
        assert os.stat(p).st_mode & 0o755 == 0o755
    env = site.env(32)
    for p in paths:  # exec'd directly, no PATH, from an unrelated cwd
        r = subprocess.run([p], env=env, cwd=site.logdir, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stderr) == (0, "")
    assert site.record(32)["backend"] == "simulated"


@pytest.mark.process
def test_install_hooks_for_another_python(site, tmp_path):
    """A slurmd that cannot run this interpreter (one in a chroot) gets hooks for its own python3: they name it
    and find the package through the path they carry, the hook path being stdlib-only."""
    other = "/usr/bin/python3"
    if not os.access(other, os.X_OK):
        pytest.skip(f"no {other} on this machine")
    paths = hook_install.install_hooks(str(tmp_path / "bin"), python=other)
    for p in paths:
        with open(p) as fh:
            text = fh.read()
        assert text.startswith(f"#!{other}\n") and f"sys.path.insert(0, {ROOT!r})" in text
    env = site.env(34)
    for p in paths:
        r = subprocess.run([p], env=env, cwd=site.logdir, capture_output=True, text=True, timeout=60)
        assert (r.returncode, r.stderr) == (0, "")
    assert site.record(34)["backend"] == "simulated"


@pytest.mark.process
def test_hook_imports_stay_light(site):
    """The Epilog's import graph has no SQLAlchemy/SQLModel/pydantic/argparse/pynvml/dataclasses."""
    env = site.env(33)
    site.run("prolog", 33)
    env["SLURM_JOB_EXIT_CODE2"] = "0:0"
    p = subprocess.run([sys.executable, "-X", "importtime", os.path.join(HOOKS, "epilog")], env=env,
                       cwd=site.logdir, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0
    base = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env, cwd=site.logdir,
                          capture_output=True, text=True, timeout=60)

    def modules(stderr: str) -> set[str]:
        return {ln.split("|")[-1].strip() for ln in stderr.splitlines() if ln.startswith("import time")}

    added = modules(p.stderr) - modules(base.stderr)  # what the hook itself imports beyond start-up
    assert "slurm_gpueff.hook" in added
    heavy = {"sqlalchemy", "sqlmodel", "pydantic", "argparse", "pynvml", "dataclasses", "logging", "tempfile"}
    assert not heavy & {m.split(".")[0] for m in added}, heavy & added
    assert record.validate(site.record(33))


def test_run_in_process_always_returns_zero(site):
    assert hook.run("bogus", {}) == 0
    assert hook.run("epilog", site.env(34)) == 0  # no prolog ran: still a record
    assert site.record(34)["start_time"] is None


def test_cli_entry_points_exist():
    """pyproject's console scripts point at functions that exist."""
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        text = fh.read()
    assert 'gpueff-prolog = "slurm_gpueff.hook:prolog_main"' in text
    assert callable(hook.prolog_main) and callable(hook.epilog_main)


def _ingest_and_read(site: HookSite, tmp_path, job_id: int):
    """The real ingest into a real SQLite file, then the job row as stored."""
    from sqlmodel import Session, select

    from slurm_gpueff.models import Job
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.ingest import ingest_spool

    engine = make_engine(str(tmp_path / "gpueff.db"))
    try:
        result = ingest_spool(engine, site.spool)
        assert (result.ingested, result.quarantined, result.failed) == (1, 0, 0), result.errors
        with Session(engine) as s:
            return s.exec(select(Job).where(Job.job_id == job_id)).one()
    finally:
        engine.dispose()


@pytest.mark.process
@pytest.mark.parametrize("var", ["SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"])
def test_unreadable_gpu_list_reason_reaches_the_database(site, tmp_path, var):
    """A GPU list the hook cannot read: the record keeps why, and ingest stores it as the job's reason
    (CUDA_VISIBLE_DEVICES is read where SLURM_JOB_GPUS is absent)."""
    env = site.env(58, gpus=None, **{var: "gpu:x"})
    for kind in ("prolog", "epilog"):
        p, _ = site.run(kind, 58, env=dict(env))
        assert p.returncode == 0, p.stderr
    why = f"{var}='gpu:x' could not be read as GPU indexes"
    assert why in site.record(58)["reason"]
    job = _ingest_and_read(site, tmp_path, 58)
    assert job.gpu_count == 0 and why in job.reason and "the GPUs were not measured" in job.reason


@pytest.mark.process
def test_seff_gpu_shows_why_an_unreadable_gpu_list_has_no_gpus(site, tmp_path):
    env = site.env(59, gpus="gpu:x")
    for kind in ("prolog", "epilog"):
        site.run(kind, 59, env=dict(env))
    _ingest_and_read(site, tmp_path, 59)
    site.write_config(paths={"database": f"sqlite:///{tmp_path / 'gpueff.db'}"})
    p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "59", "--config", site.config_path],
                       capture_output=True, text=True, timeout=60, cwd=str(tmp_path),
                       env={**os.environ, "PYTHONPATH": ROOT, "PATH": "/nonexistent"})
    assert p.returncode == 5, p.stderr
    assert "SLURM_JOB_GPUS='gpu:x' could not be read as GPU indexes" in p.stderr, p.stderr
