"""MIG attribution and GPU id mapping (pure logic + the simulated backend through the real hooks; no GPU).

Needs no DCGM and no GPU: MIG cannot be enabled on the GPU machine without a reset, so slice attribution
is tested with the simulated backend and the id-mapping functions directly."""

from __future__ import annotations

import json
import os

from slurm_gpueff import hook
from slurm_gpueff.collectors import nvml
from slurm_gpueff.collectors.base import JobContext
from slurm_gpueff.config import Config
from slurm_gpueff.node.gpu_ids import (
    job_slices,
    normalize_bus_id,
    parse_legacy_mig,
    parse_proc_information,
    proc_gpus,
    profile_from_name,
    resolve,
)
from slurm_gpueff.record import validate

PARENT = "GPU-5fd74992-a5d1-450a-00ed-3391db2f1075"
# The real information file of the H100 on the GPU machine (driver 580.159.04).
INFO = ("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 41\nGPU UUID: \t GPU-5fd74992-a5d1-450a-00ed-3391db2f1075\n"
        "Video BIOS: \t 96.00.da.00.0c\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\n"
        "Bus Location: \t 0000:00:06.0\nDevice Minor: \t 0\nGPU Firmware: \t 580.159.04\nGPU Excluded:\t No\n")


def test_bus_ids_compare_equal_across_spellings():
    assert normalize_bus_id("00000000:3B:00.0") == normalize_bus_id("0000:3b:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("3b:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("junk") is None and normalize_bus_id(None) is None


def test_proc_information(tmp_path):
    assert parse_proc_information(INFO) == {"minor": 0, "uuid": PARENT, "pci_bus_id": "0000:00:06.0",
                                            "model": "NVIDIA H100 80GB HBM3"}
    (tmp_path / "0000:00:06.0").mkdir()
    (tmp_path / "0000:00:06.0" / "information").write_text(INFO)
    (tmp_path / "0000:00:07.0").mkdir()  # unreadable entry: skipped
    assert list(proc_gpus(str(tmp_path))) == [0]
    assert proc_gpus(str(tmp_path / "absent")) == {}


def test_job_slices_pairs_slurm_indexes_with_mig_uuids():
    a, b = "MIG-11111111-1111-5111-8111-111111111111", "MIG-22222222-2222-5222-8222-222222222222"
    assert job_slices({"SLURM_JOB_GPUS": "3,5", "CUDA_VISIBLE_DEVICES": f"{a},{b}"}) == [(3, a), (5, b)]
    assert job_slices({"CUDA_VISIBLE_DEVICES": f"{a},{b}"}) == [(0, a), (1, b)]
    assert job_slices({"SLURM_JOB_GPUS": f"{a}"}) == [(0, a)]
    assert job_slices({"SLURM_JOB_GPUS": "0,1", "CUDA_VISIBLE_DEVICES": "0,1"}) == []
    assert job_slices({}) == []


def test_mig_uuid_forms_and_resolution():
    assert parse_legacy_mig(f"MIG-{PARENT}/3/0") == {"parent_uuid": PARENT, "gi_id": 3, "ci_id": 0}
    assert parse_legacy_mig("MIG-8f2c1e9a-0000-5000-8000-000000000001") is None
    assert profile_from_name("NVIDIA H100 80GB HBM3 MIG 1g.10gb") == "1g.10gb"
    assert profile_from_name("NVIDIA H100 80GB HBM3") is None
    opaque = "MIG-8f2c1e9a-0000-5000-8000-000000000001"
    inv = {opaque: {"parent_uuid": PARENT, "gi_id": 9, "ci_id": 0, "profile": "1g.10gb"}}
    assert resolve(opaque, inv, None)[0]["gi_id"] == 9
    desc, why = resolve(opaque, {}, None)
    assert desc is None and "unknown" in why

    def broken(_u):
        raise RuntimeError("NVML says no")

    desc, why = resolve(opaque, {}, broken)
    assert desc is None and "NVML says no" in why


def test_nvml_backend_never_charges_a_slice_the_whole_gpu(tmp_path):
    """MIG job on the nvml backend without the agent: slice identity recorded, every figure None with a reason."""
    from slurm_gpueff.collectors.nvml import NvmlCollector

    cfg = Config({"paths": {"state_dir": str(tmp_path)}, "collector": {"backend": "nvml"}})
    env = {"SLURM_JOB_GPUS": "4", "CUDA_VISIBLE_DEVICES": f"MIG-{PARENT}/2/0"}
    job = JobContext(5, "n", "c", [4], 1.0, 100.0, env)
    coll = NvmlCollector(cfg)
    meas = coll.stop(job, json.loads(json.dumps(coll.start(job))))
    (g,) = meas.gpus
    assert g["index"] == 4 and g["uuid"] == PARENT and g["mig_gi_id"] == 2
    assert all(g[m] is None for m in nvml.GPM_MIG_METRICS + nvml.WHOLE_GPU_ONLY)
    assert "whole-GPU only" in g["missing"]["kernel_active"] and "whole-GPU only" in g["missing"]["energy_j"]
    assert "agent not running" in g["missing"]["sm_active"] and "agent not running" in meas.reason


def test_simulated_mig_attribution_through_the_hooks(tmp_path):
    """Two slices of one GPU in one job: one row each, keyed by Slurm index, attributed to parent + GI."""
    conf = tmp_path / "gpueff.toml"
    conf.write_text(f'[paths]\nstate_dir = "{tmp_path}/state"\nspool_dir = "{tmp_path}/spool"\n'
                    '[collector]\nbackend = "simulated"\n[dcgm]\nhostengine = "127.0.0.1:1"\n')
    s1, s2 = f"MIG-{PARENT}/1/0", f"MIG-{PARENT}/2/0"
    env = {"SLURM_JOB_ID": "600", "SLURM_JOB_GPUS": "7,8", "CUDA_VISIBLE_DEVICES": f"{s1},{s2}",
           "SLURMD_NODENAME": "n1", "GPUEFF_CONFIG": str(conf), "GPUEFF_SIM_PROFILE": "oversized"}
    assert hook.run("prolog", env) == 0
    assert hook.run("epilog", {**env, "SLURM_JOB_EXIT_CODE2": "0:0"}) == 0
    (path,) = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path / "spool") for f in fs if f.endswith(".json")]
    with open(path) as fh:
        rec = validate(json.load(fh))
    assert [(g["index"], g["mig_uuid"], g["mig_gi_id"], g["uuid"]) for g in rec["gpus"]] == [
        (7, s1, 1, PARENT), (8, s2, 2, PARENT)]
    g = rec["gpus"][0]
    assert g["sm_active"] == 0.30 and g["memory_total_bytes"] == 10 * 2**30 and g["mig_profile"] == "1g.10gb"
    assert g["kernel_active"] is None and "whole-GPU only" in g["missing"]["kernel_active"]


def test_dcgm_and_mig_fields_validate_and_reach_the_database(tmp_path):
    """The optional record fields: strict validation, then stored in their job_gpu columns (real SQLite)."""
    import pytest
    from hooksite import make_record
    from sqlmodel import Session, select

    from slurm_gpueff import spool
    from slurm_gpueff.errors import RecordError
    from slurm_gpueff.models import JobGpu
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.ingest import ingest_spool

    rec = make_record(901, gpus=1, backend="dcgm")
    rec["gpus"][0].update(xid_errors=2, throttle_s={"power": 2.5, "thermal": 0.0}, processes=[4242, 4243],
                          mig_uuid=f"MIG-{PARENT}/1/0", mig_profile="1g.10gb", mig_gi_id=1, mig_ci_id=0)
    validate(rec)
    for bad in ({"xid_errors": -1}, {"throttle_s": {"power": -1}}, {"processes": [0]}, {"mig_gi_id": "1"},
                {"mig_profile": "x" * 40}, {"throttle_s": [1]}):
        broken = json.loads(json.dumps(rec))
        broken["gpus"][0].update(bad)
        with pytest.raises(RecordError):
            validate(broken)
    sp = str(tmp_path / "spool")
    spool.write_record(sp, rec)
    engine = make_engine(str(tmp_path / "db.sqlite"))
    assert ingest_spool(engine, sp).ingested == 1
    with Session(engine) as s:
        row = s.exec(select(JobGpu)).one()
    assert (row.xid_errors, row.throttle_s, row.processes) == (2, {"power": 2.5, "thermal": 0.0}, [4242, 4243])
    assert (row.mig_uuid, row.mig_profile, row.mig_gi_id, row.mig_ci_id) == (f"MIG-{PARENT}/1/0", "1g.10gb", 1, 0)


def test_doctor_lines_and_exit_status(tmp_path, capsys):
    """gpueff doctor on this (GPU-less) machine: every line PASS/WARN/FAIL; FAIL (exit 1) when the
    configured backend cannot work (dcgm without a hostengine), exit 0 otherwise."""
    from slurm_gpueff.cli import doctor

    base = {"paths": {"state_dir": str(tmp_path / "state"), "spool_dir": str(tmp_path / "spool"),
                      "database": str(tmp_path / "db.sqlite")}, "dcgm": {"hostengine": "127.0.0.1:1"}}
    assert doctor.run(Config({**base, "collector": {"backend": "none"}}), as_json=True) == 0
    out = json.loads(capsys.readouterr().out)
    checks = {c["check"]: c["status"] for c in out["checks"]}
    assert {"config", "nvml", "dcgm bindings", "dcgm hostengine", "agent", "spool dir", "database"} <= set(checks)
    assert set(checks.values()) <= {"PASS", "WARN", "FAIL"} and out["failures"] == 0
    assert doctor.run(Config({**base, "collector": {"backend": "dcgm"}})) == 1
    text = capsys.readouterr().out
    assert "FAIL  dcgm hostengine" in text and "no nv-hostengine answering at 127.0.0.1:1" in text
