"""The dcgm backend against a FAKE of DCGM's Python bindings (tests/fake_dcgm: the module surface of
dcgm_agent / dcgm_structs / dcgm_fields written from DCGM's documented API, with an in-process stand-in
for nv-hostengine). DCGM cannot be installed on these machines; everything else here is real: the
collector, the binding import by path, a real TCP listener as the hostengine's port (the backend probes
it before importing anything), the real hook, the real spool, the real gpueff agent for the fallback.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time

import pytest

from slurm_gpueff import hook
from slurm_gpueff.collectors import dcgm_bindings as dcgmb
from slurm_gpueff.collectors.base import JobContext
from slurm_gpueff.collectors.dcgm import DcgmCollector, fp64, i32, i64
from slurm_gpueff.config import Config
from slurm_gpueff.record import validate

pytestmark = pytest.mark.dcgm

FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fake_dcgm")
UUID0 = "GPU-11111111-2222-3333-4444-555555555550"
UUID1 = "GPU-11111111-2222-3333-4444-555555555551"


@pytest.fixture(scope="module")
def hostengine_port():
    """A real listening socket standing in for nv-hostengine's port (connections accepted, then closed)."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    stop = threading.Event()

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
                c.close()
            except OSError:
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    srv.close()


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def engine():
    if FAKE not in sys.path:
        sys.path.insert(0, FAKE)
    import dcgm_agent

    e = dcgm_agent.ENGINE
    e.reset()
    e.add_gpu(0, UUID0, "00000000:3B:00.0")
    e.add_gpu(1, UUID1, "00000000:86:00.0")
    for gid in (0, 1):
        for f, v in {1002: 0.41, 1003: 0.2, 1004: 0.3, 1005: 0.15, 1006: 0.0, 1007: 0.05, 1008: 0.02,
                     1013: 0.0, 1014: 0.29, 1015: 0.01}.items():
            e.prof[(1, gid, f)] = v
    yield e
    e.reset()


@pytest.fixture
def node(tmp_path, hostengine_port):
    """/dev and /proc/driver/nvidia stand-ins: minors 0,1; minor 0 is the GPU DCGM calls 1 (ids differ)."""
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in ("nvidia0", "nvidia1", "nvidiactl"):
        (dev / n).touch()
    proc = tmp_path / "proc"
    for minor, uuid, bus in ((0, UUID1, "0000:86:00.0"), (1, UUID0, "0000:3b:00.0")):
        d = proc / bus
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:  \t\t 42\nGPU UUID: \t {uuid}\n"
                                       f"Bus Location: \t {bus}\nDevice Minor: \t {minor}\n")
    state = tmp_path / "state"
    cfg = Config({"paths": {"state_dir": str(state), "spool_dir": str(tmp_path / "spool")},
                  "collector": {"backend": "dcgm"},
                  "dcgm": {"bindings_path": FAKE, "hostengine": f"127.0.0.1:{hostengine_port}",
                           "exporter_mapping": True, "exporter_mapping_dir": str(tmp_path / "map")}})
    return cfg, str(dev), str(proc), tmp_path


def _job(gpus=(0, 1), job_id=77, env=None, start=1000.0, end=4600.0):
    return JobContext(job_id, "n1", "c", list(gpus), start, end, env or {"SLURM_JOB_GPUS": ",".join(map(str, gpus))})


def _coll(node, **kw):
    cfg, dev, proc, _ = node
    return DcgmCollector(cfg, dev_dir=dev, proc_dir=proc, **kw)


def _run(coll, job):
    state = coll.start(job)
    json.dumps(state)  # must be storable by the Prolog
    return state, coll.stop(job, json.loads(json.dumps(state)))


def test_blank_sentinels_become_none():
    assert i32(0x7FFFFFF0) is None and i32(0x7FFFFFF2) is None and i32(95) == 95 and i32(-1) is None
    assert i64(0x7FFFFFFFFFFFFFF0) is None and i64(123) == 123
    assert fp64(140737488355328.0) is None and fp64(140737488355330.0) is None and fp64(0.5) == 0.5
    assert fp64(float("nan")) is None


def test_job_stats_and_profiling_per_allocation(engine, node):
    """Group of exactly the job's GPUs, mapped by UUID (Slurm index 0 = minor 0 = DCGM gpu 1)."""
    engine.stats[1] = {"smUtilization.average": 87, "energyConsumed": 3_600_000, "powerUsage.average": 250.5,
                       "maxGpuMemoryUsed": 12 * 2**30, "numXidCriticalErrors": 2, "thermalViolationTime": 1_000_000}
    coll = _coll(node)
    state, meas = _run(coll, _job(gpus=(0,)))
    assert [t["gpu_id"] for t in state["dcgm"]["targets"].values()] == [1]
    assert meas.backend == "dcgm" and meas.reason is None
    g = meas.gpus[0]
    assert g["uuid"] == UUID1 and g["pci_bus_id"] == "0000:86:00.0" and g["minor"] == 0
    assert g["kernel_active"] == 0.87  # job-stats "SM Utilization" is kernel activity
    assert g["sm_active"] == 0.41 and g["tensor_active"] == 0.3 and g["fp32_active"] == 0.05
    assert g["energy_j"] == 3600.0 and g["power_mean_w"] == 250.5 and g["memory_used_peak_bytes"] == 12 * 2**30
    assert g["xid_errors"] == 2 and g["throttle_s"]["thermal"] == 1.0 and g["throttle_s"]["power"] == 2.5
    assert g["processes"] == [4242] and g["source"] == "dcgm" and g["samples"] >= 1
    assert g["missing"] == {}
    # job, watches and group are gone from the hostengine; connections asked to persist
    assert engine.jobs == {} and engine.groups == {} and engine.field_groups == {} and engine.watches == set()
    assert all(p["persist"] == 1 for p in engine.connect_params)
    # a job record built from it validates
    validate({"schema": 1, "cluster": "c", "node": "n1", "job_id": 77, "start_time": 1.0, "end_time": 2.0,
              "backend": "dcgm", "gpus": meas.gpus})


def test_blank_job_stats_are_none_with_reason(engine, node):
    engine.stats[0] = {"energyConsumed": 0x7FFFFFFFFFFFFFF0, "powerUsage.average": 140737488355328.0,
                       "smUtilization.average": 0x7FFFFFF2, "numXidCriticalErrors": 0x7FFFFFF0}
    engine.prof[(1, 0, 1004)] = 140737488355328.0
    _, meas = _run(_coll(node), _job(gpus=(1,)))
    g = meas.gpus[0]
    for m in ("energy_j", "power_mean_w", "kernel_active", "tensor_active", "xid_errors"):
        assert g[m] is None and "blank" in g["missing"][m], m
    assert g["sm_active"] == 0.41 and g["memory_used_peak_bytes"] == 8 * 2**30


def test_profiling_multi_pass_drops_fields_with_reason(engine, node):
    engine.multi_pass_max = 4
    state, meas = _run(_coll(node), _job())
    assert state["dcgm"]["prof_fields"] == [1002, 1003, 1004, 1005]
    for g in meas.gpus:
        assert g["sm_active"] == 0.41 and g["dram_active"] == 0.15
        for m in ("fp64_active", "fp32_active", "fp16_active"):
            assert g[m] is None and "PROFILING_MULTI_PASS" in g["missing"][m]


def test_profiling_no_data_is_none_with_reason(engine, node):
    del engine.prof[(1, 0, 1003)]
    _, meas = _run(_coll(node), _job(gpus=(1,)))
    assert meas.gpus[0]["sm_occupancy"] is None and "no samples" in meas.gpus[0]["missing"]["sm_occupancy"]


def test_duplicate_job_id_is_cleared_and_retried(engine, node):
    engine.jobs["gpueff-77"] = {"gid": 999, "running": True}  # a requeued job's leftover
    _, meas = _run(_coll(node), _job())
    assert meas.backend == "dcgm" and "stale DCGM job" in meas.reason
    assert all(g["kernel_active"] == 0.9 for g in meas.gpus)


@pytest.mark.parametrize("fn,code,words", [
    ("dcgmJobStartStats", -26, "duplicate job id"),
    ("dcgmJobStartStats", -29, "must run as root"),
    ("dcgmConnect_v2", -21, "cannot connect"),
])
def test_start_errors_fall_back_to_allocation_only(engine, node, fn, code, words):
    engine.fail[fn] = code
    if fn == "dcgmJobStartStats" and code == -26:
        engine.fail["dcgmJobRemove"] = -14  # the stale entry cannot be removed either
    state, meas = _run(_coll(node), _job())
    assert words in state["dcgm_error"]
    assert meas.backend == "none" and words in meas.reason and "no gpueff agent" in meas.reason
    assert [g["index"] for g in meas.gpus] == [0, 1] and all(g["sm_active"] is None for g in meas.gpus)
    assert engine.groups == {}  # nothing left behind in the hostengine


@pytest.mark.parametrize("fn,code,words", [("dcgmJobGetStats", -14, "no data"),
                                           ("dcgmJobStopStats", -21, "connection")])
def test_end_errors_fall_back(engine, node, fn, code, words):
    coll = _coll(node)
    job = _job()
    state = coll.start(job)
    engine.fail[fn] = code
    meas = coll.stop(job, state)
    assert meas.backend == "none" and "DCGM failed at job end" in meas.reason and words in meas.reason
    assert engine.groups == {} and engine.jobs == {}  # cleaned up even so


def test_hostengine_down_and_bindings_missing(engine, node, tmp_path):
    cfg, dev, proc, _ = node
    down = Config({"paths": cfg.paths.as_dict(), "dcgm": {"bindings_path": FAKE,
                                                          "hostengine": f"127.0.0.1:{_free_port()}"}})
    state, meas = _run(DcgmCollector(down, dev_dir=dev, proc_dir=proc), _job())
    assert "no nv-hostengine answering" in meas.reason and meas.backend == "none"
    assert "dcgmConnect_v2" not in engine.calls  # probed, never connected
    empty = tmp_path / "nobindings"
    empty.mkdir()
    nob = Config({"paths": cfg.paths.as_dict(), "dcgm": {"bindings_path": str(empty),
                                                         "hostengine": cfg.dcgm.hostengine}})
    _, meas = _run(DcgmCollector(nob, dev_dir=dev, proc_dir=proc), _job())
    assert "DCGM Python bindings not found" in meas.reason


def test_unknown_gpu_and_missing_prolog_state(engine, node):
    coll = _coll(node)
    _, meas = _run(coll, _job(gpus=(0, 5)))
    assert meas.gpus[0]["sm_active"] == 0.41
    assert meas.gpus[1]["sm_active"] is None and "no /dev/nvidiaN" in meas.gpus[1]["missing"]["sm_active"]
    meas = coll.stop(_job(), None)
    assert meas.backend == "none" and "no start state" in meas.reason


def test_falls_back_to_the_nvml_agent(engine, node):
    """Hostengine dies during the job: the agent's counters, snapshotted at job start too, are used."""
    from fake_gpus import FakeClock, FakeSampler, hopper

    from slurm_gpueff.node.agent import Agent

    cfg, dev, proc, _ = node
    clock = FakeClock(wall0=time.time())
    sampler = FakeSampler(clock, [hopper(UUID1, index=0), hopper(UUID0, index=1)])
    sampler.set(UUID1, kernel_pct=60.0, gpm={"sm_active": 30.0})
    agent = Agent(cfg, sampler, wall_clock=clock.wall)
    agent.open()
    agent.tick()
    coll = DcgmCollector(cfg, dev_dir=dev, proc_dir=proc)
    job = _job(gpus=(0,))
    state = coll.start(job)
    assert state["fallback"] == "nvml" and state["uuids"] == [UUID1] and "dcgm" in state
    for _ in range(4):
        clock.advance(5)
        agent.tick()
    engine.fail["dcgmConnect_v2"] = -21
    meas = coll.stop(job, state)
    assert meas.backend in ("nvml-gpm", "nvml") and "figures from the gpueff agent" in meas.reason
    assert meas.gpus[0]["uuid"] == UUID1 and meas.gpus[0]["kernel_active"] == 0.6
    assert meas.gpus[0]["sm_active"] == 0.3


def test_mig_slices_by_gpu_instance(engine, node):
    """MIG: job stats None with the reason; profiling fields read for the GPU instance entity."""
    engine.gpu_instances = [{"entity_id": 7, "gpu_id": 0, "gi_id": 1}, {"entity_id": 8, "gpu_id": 0, "gi_id": 2}]
    engine.prof[(4, 8, 1002)] = 0.66
    mig_uuid = f"MIG-{UUID0}/2/0"
    env = {"SLURM_JOB_GPUS": "3", "CUDA_VISIBLE_DEVICES": mig_uuid}
    state, meas = _run(_coll(node, mig_lookup=None), _job(gpus=(3,), env=env))
    g = meas.gpus[0]
    assert g["index"] == 3 and g["uuid"] == UUID0 and g["mig_uuid"] == mig_uuid and g["mig_gi_id"] == 2
    assert g["sm_active"] == 0.66
    assert g["kernel_active"] is None and "MIG" in g["missing"]["kernel_active"]
    assert g["energy_j"] is None and "MIG" in g["missing"]["energy_j"]
    assert "dcgmJobStartStats" not in engine.calls
    assert os.listdir(node[3] / "map") == [".gpueff.lock"]  # the exporter labels whole GPUs only


def test_mig_opaque_uuid_resolved_by_lookup(engine, node):
    engine.gpu_instances = [{"entity_id": 9, "gpu_id": 1, "gi_id": 5}]
    engine.prof[(4, 9, 1002)] = 0.5
    opaque = "MIG-8f2c1e9a-0000-5000-8000-000000000001"
    seen = []

    def lookup(u):
        seen.append(u)
        return {"mig_uuid": u, "parent_uuid": UUID1, "gi_id": 5, "ci_id": 0, "profile": "1g.10gb",
                "memory_total_bytes": 10 * 2**30}

    _, meas = _run(_coll(node, mig_lookup=lookup), _job(gpus=(), env={"CUDA_VISIBLE_DEVICES": opaque}))
    g = meas.gpus[0]
    assert seen == [opaque, opaque] or seen == [opaque]
    assert g["index"] == 0 and g["mig_profile"] == "1g.10gb" and g["memory_total_bytes"] == 10 * 2**30
    assert g["sm_active"] == 0.5 and g["uuid"] == UUID1


def test_exporter_mapping_written_and_removed(engine, node):
    coll = _coll(node)
    mapdir = node[3] / "map"
    mapdir.mkdir()
    (mapdir / "0").write_text("55\n")  # another job sharing DCGM GPU 0
    (mapdir / "1").write_text("")
    job = _job(gpus=(0,))  # Slurm 0 -> DCGM gpu 1
    state = coll.start(job)
    assert (mapdir / "1").read_text() == "77\n" and (mapdir / "0").read_text() == "55\n"
    coll.stop(job, state)
    assert not (mapdir / "1").exists() and (mapdir / "0").read_text() == "55\n"


def test_hook_end_to_end_and_never_fails(engine, node):
    """The real hooks (in-process): a MIG job measured through DCGM; then DCGM refusing (root required)
    gives an allocation-only record with the reason, exit 0, nothing left in the hostengine."""
    cfg, dev, proc, tmp = node
    conf = tmp / "gpueff.toml"
    conf.write_text(f'[paths]\nstate_dir = "{cfg.paths.state_dir}"\nspool_dir = "{cfg.paths.spool_dir}"\n'
                    f'[collector]\nbackend = "dcgm"\n[dcgm]\nbindings_path = "{FAKE}"\n'
                    f'hostengine = "{cfg.dcgm.hostengine}"\n')
    engine.gpu_instances = [{"entity_id": 7, "gpu_id": 0, "gi_id": 1}]
    engine.prof[(4, 7, 1002)] = 0.25
    env = {"SLURM_JOB_GPUS": "2", "CUDA_VISIBLE_DEVICES": f"MIG-{UUID0}/1/0", "SLURMD_NODENAME": "n1",
           "GPUEFF_CONFIG": str(conf)}

    def record(job_id: str) -> dict:
        e = {**env, "SLURM_JOB_ID": job_id}
        assert hook.run("prolog", e) == 0
        assert hook.run("epilog", {**e, "SLURM_JOB_EXIT_CODE2": "0:0"}) == 0
        (path,) = [os.path.join(dp, f) for dp, _, fs in os.walk(cfg.paths.spool_dir) for f in fs
                   if f"-{job_id}" in f or f"{job_id}-" in f or f.startswith(job_id)]
        return validate(json.load(open(path)))

    rec = record("91")
    assert rec["backend"] == "dcgm" and rec["gpus"][0]["index"] == 2 and rec["gpus"][0]["sm_active"] == 0.25
    assert rec["gpus"][0]["mig_uuid"] == f"MIG-{UUID0}/1/0" and rec["gpus"][0]["uuid"] == UUID0
    engine.fail["dcgmGroupCreate"] = -29
    rec = record("92")
    assert rec["backend"] == "none" and "root" in rec["reason"] and rec["gpus"][0]["index"] == 2
    assert engine.groups == {} and engine.jobs == {}


def test_address_parsing_and_probe(hostengine_port):
    assert dcgmb.parse_address("10.0.0.5") == ("tcp", "10.0.0.5", 5555)
    assert dcgmb.parse_address("node1:6000") == ("tcp", "node1", 6000)
    assert dcgmb.parse_address("[::1]:7000") == ("tcp", "::1", 7000)
    assert dcgmb.parse_address("unix:///run/nv-hostengine.sock") == ("unix", "/run/nv-hostengine.sock", 0)
    assert dcgmb.probe(f"127.0.0.1:{hostengine_port}", 0.5) is None
    assert "no nv-hostengine" in dcgmb.probe(f"127.0.0.1:{_free_port()}", 0.5)


def test_auto_selects_dcgm_only_when_a_hostengine_answers(hostengine_port, tmp_path):
    from slurm_gpueff.collectors.choice import get_collector

    base = {"paths": {"state_dir": str(tmp_path)}}
    up = Config({**base, "dcgm": {"hostengine": f"127.0.0.1:{hostengine_port}"}})
    down = Config({**base, "dcgm": {"hostengine": f"127.0.0.1:{_free_port()}"}})
    assert get_collector(up).name == "dcgm"
    assert get_collector(down).name == "none"


def test_exporter_mapping_concurrent_jobs_keep_each_others_lines(tmp_path):
    """Hooks of different jobs on one node run at once: under the lock no job's line is lost."""
    from slurm_gpueff.collectors.dcgm import map_job, unmap_job

    d = str(tmp_path / "map")
    threads = [threading.Thread(target=map_job, args=(d, [0, 1], str(j))) for j in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    read = lambda name: open(os.path.join(d, name)).read()  # noqa: E731,SIM115 - tiny files, read whole
    assert sorted(read("0").split(), key=int) == [str(j) for j in range(20)]
    for j in range(19):
        unmap_job(d, [0], str(j))
    assert read("0") == "19\n" and len(read("1").split()) == 20
    unmap_job(d, [0], "19")
    assert not os.path.exists(os.path.join(d, "0"))
