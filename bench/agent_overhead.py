#!/usr/bin/env python3
"""What the nvml node agent costs: its CPU time, and whether a busy GPU job slows down while it runs.

In one run:

0. the cost of each NVML call the agent makes (wall and CPU time per call, per GPU);
1. the agent at its default interval (5 s) for ``--cpu-seconds`` (60): CPU seconds from
   /proc/<pid>/stat and from the agent's own ``cpu_s``; reported as CPU-s per GPU-hour and % of one core
   per GPU (goal <= 0.1 %);
2. bf16 8192x8192 matmul TFLOP/s without the agent (A) and with it (B), interleaved A/B/B/A/A/B/B/A in the
   same run; the ratio B/A (goal >= 99.5 % kept), against baselines measured in this run.

Run (repo root, on a GPU node):  ``PYTHONPATH=. python3 bench/agent_overhead.py``
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
CLK_TCK = os.sysconf("SC_CLK_TCK")


def nvml_call_costs(reps: int = 200) -> dict[str, dict[str, float]]:
    """Wall and CPU microseconds per call of each NVML function the agent uses (GPU 0)."""
    import pynvml as nv

    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s1)
    time.sleep(1.0)
    nv.nvmlGpmSampleGet(h, s2)
    ids = [nv.NVML_GPM_METRIC_SM_UTIL, nv.NVML_GPM_METRIC_SM_OCCUPANCY, nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
           nv.NVML_GPM_METRIC_DRAM_BW_UTIL, nv.NVML_GPM_METRIC_FP64_UTIL, nv.NVML_GPM_METRIC_FP32_UTIL,
           nv.NVML_GPM_METRIC_FP16_UTIL]

    def metrics() -> None:
        m = nv.c_nvmlGpmMetricsGet_t()
        m.version = nv.NVML_GPM_METRICS_GET_VERSION
        m.numMetrics = len(ids)
        m.sample1, m.sample2 = s1, s2
        for i, mid in enumerate(ids):
            m.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(m)

    ts = [0]

    def samples() -> None:
        try:
            _, ss = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, ts[0])
            if ss:
                ts[0] = max(x.timeStamp for x in ss)
        except nv.NVMLError_NotFound:
            pass

    calls = {
        "utilization_rates": lambda: nv.nvmlDeviceGetUtilizationRates(h),
        "utilization_samples": samples,
        "memory_info_v2": lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2),
        "power_usage": lambda: nv.nvmlDeviceGetPowerUsage(h),
        "total_energy": lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h),
        "gpm_sample_get": lambda: nv.nvmlGpmSampleGet(h, s2),
        "gpm_metrics_get_7": metrics,
    }
    out = {}
    for name, fn in calls.items():
        n = reps if name not in ("total_energy",) else max(20, reps // 5)
        fn()
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = {"wall_us": 1e6 * (time.perf_counter() - w0) / n, "cpu_us": 1e6 * (time.process_time() - c0) / n}
    _, buf = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
    span = (buf[-1].timeStamp - buf[0].timeStamp) / 1e6 if len(buf) > 1 else 0.0
    nv.nvmlGpmSampleFree(s1)
    nv.nvmlGpmSampleFree(s2)
    n_gpus = nv.nvmlDeviceGetCount()
    nv.nvmlShutdown()
    out["_gpus"] = {"count": n_gpus}
    out["_util_buffer"] = {"samples": len(buf), "span_s": span}
    # The agent's own code paths (one GPU): what a tick spends in NVML.
    from slurm_gpueff.node.nvml_sampler import NvmlSampler

    smp = NvmlSampler()
    smp.open()
    dev = smp._devs[0]
    for name, fn in (("agent_kernel_pct", lambda: smp._kernel_pct(dev)),
                     ("agent_sample_all", lambda: smp.sample(False)),
                     ("agent_sample_all_energy", lambda: smp.sample(True))):
        n = 20
        time.sleep(0.3)
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
            time.sleep(0.05)
        w = time.perf_counter() - w0 - 0.05 * n
        out[name] = {"wall_us": 1e6 * w / n, "cpu_us": 1e6 * (time.process_time() - c0) / n}
    smp.close()
    return out


def state_write_costs(reps: int = 50) -> dict[str, dict[str, float]]:
    """CPU and wall per state-file write: spool.atomic_write with its 2 fsyncs vs durable=False (the agent's)."""
    from slurm_gpueff import spool

    data = b"x" * 6000  # about a 1-GPU state file
    out = {}
    for base in ("/tmp", "/dev/shm"):
        if not os.path.isdir(base):
            continue
        d = tempfile.mkdtemp(dir=base)
        for name, fn in (("atomic_write_fsync", lambda p: spool.atomic_write(p, data, 0o644)),
                         ("replace_file", lambda p: spool.atomic_write(p, data, 0o644, durable=False))):
            c0, w0 = time.process_time(), time.perf_counter()
            for _ in range(reps):
                fn(os.path.join(d, "state.json"))
            out[f"{base}:{name}"] = {"wall_us": 1e6 * (time.perf_counter() - w0) / reps,
                                     "cpu_us": 1e6 * (time.process_time() - c0) / reps}
    return out


def tick_profile(tmp: str, ticks: int = 20) -> dict[str, Any]:
    """Where a real agent tick's CPU goes (cProfile, one GPU, state dir on /tmp)."""
    import cProfile
    import io
    import pstats

    from slurm_gpueff.config import Config
    from slurm_gpueff.node.agent import Agent
    from slurm_gpueff.node.nvml_sampler import NvmlSampler

    ag = Agent(Config({"paths": {"state_dir": os.path.join(tmp, "prof")}}), NvmlSampler())
    ag.open()
    ag.tick()
    cpu = []
    prof = cProfile.Profile()
    for _ in range(ticks):
        time.sleep(0.25)
        prof.enable()
        ag.tick()
        prof.disable()
        cpu.append(ag.tick_cpu_s)
    ag.close()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(8)
    return {"tick_cpu_ms_mean": 1e3 * statistics.mean(cpu), "tick_cpu_ms_median": 1e3 * statistics.median(cpu),
            "profile": s.getvalue()}


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def write_config(tmp: str, interval: float) -> str:
    path = os.path.join(tmp, f"gpueff-{interval:g}.toml")
    with open(path, "w") as fh:
        fh.write(f'[paths]\nstate_dir = "{tmp}/state-{interval:g}"\n[agent]\ninterval_s = {interval}\n')
    return path


def start_agent(cfg_path: str, state_dir: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "agent", "--config", cfg_path],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    path = os.path.join(state_dir, "agent", "state.json")
    for _ in range(600):
        if proc.poll() is not None:
            raise SystemExit(f"agent exited with {proc.returncode}")
        if read_state(path).get("ticks", 0) >= 1:
            return proc
        time.sleep(0.1)
    raise SystemExit("agent wrote no state")


def read_state(path: str) -> dict[str, Any]:
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def stop_agent(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


def agent_cpu(tmp: str, interval: float, seconds: float, n_gpus: int) -> dict[str, float]:
    cfg = write_config(tmp, interval)
    path = os.path.join(tmp, f"state-{interval:g}", "agent", "state.json")
    proc = start_agent(cfg, os.path.dirname(os.path.dirname(path)))
    try:
        time.sleep(0.5)
        s0, p0, w0 = read_state(path), proc_cpu_s(proc.pid), time.time()
        tick_cpu = []
        end = w0 + seconds
        last_ticks = s0.get("ticks", 0)
        while time.time() < end:
            time.sleep(min(0.5, max(0.0, end - time.time())))
            st = read_state(path)
            if st.get("ticks", 0) != last_ticks and st.get("prev_tick_cpu_s") is not None:
                tick_cpu.append(st["prev_tick_cpu_s"])
                last_ticks = st["ticks"]
        s1, p1, w1 = read_state(path), proc_cpu_s(proc.pid), time.time()
    finally:
        stop_agent(proc)
    wall = w1 - w0
    cpu_proc = p1 - p0
    cpu_self = s1["cpu_s"] - s0["cpu_s"]
    ticks = s1["ticks"] - s0["ticks"]
    res = {
        "interval_s": interval, "wall_s": wall, "ticks": ticks, "gpus": n_gpus,
        "cpu_s_proc_stat": cpu_proc, "cpu_s_self": cpu_self,
        "cpu_s_per_gpu_hour": 3600 * cpu_self / wall / n_gpus,
        "pct_core_per_gpu": 100 * cpu_self / wall / n_gpus,
        "pct_core_per_gpu_proc_stat": 100 * cpu_proc / wall / n_gpus,
        "tick_cpu_ms_median": 1e3 * statistics.median(tick_cpu) if tick_cpu else float("nan"),
        "tick_cpu_ms_max": 1e3 * max(tick_cpu) if tick_cpu else float("nan"),
    }
    return res


def matmul_phases(tmp: str, interval: float, phase_s: float, pairs: int, warm_s: float = 15.0) -> dict[str, Any]:
    import torch

    n = 8192
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    flop = 2 * n**3
    for _ in range(50):
        torch.matmul(x, y, out=out)
    torch.cuda.synchronize()

    def phase() -> float:
        total_ms, iters = 0.0, 0
        end = time.time() + phase_s
        while time.time() < end:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(50):
                torch.matmul(x, y, out=out)
            b.record()
            b.synchronize()
            total_ms += a.elapsed_time(b)
            iters += 50
        return flop * iters / (total_ms / 1e3) / 1e12

    cfg = write_config(tmp, interval)
    state = os.path.join(tmp, f"state-{interval:g}")
    end = time.time() + warm_s  # reach thermal/clock steady state before the first baseline
    while time.time() < end:
        for _ in range(50):
            torch.matmul(x, y, out=out)
        torch.cuda.synchronize()
    seq: list[dict[str, Any]] = []
    # A B B A per pair: a linear drift (the GPU warming up) cancels out of mean(B)/mean(A).
    for _ in range(pairs):
        for with_agent in (False, True, True, False):
            if with_agent:
                proc = start_agent(cfg, state)
                try:
                    seq.append({"agent": True, "tflops": phase()})
                finally:
                    stop_agent(proc)
            else:
                seq.append({"agent": False, "tflops": phase()})
    a = [p["tflops"] for p in seq if not p["agent"]]
    b = [p["tflops"] for p in seq if p["agent"]]
    return {"interval_s": interval, "phase_s": phase_s, "sequence": seq, "mean_without": statistics.mean(a),
            "mean_with": statistics.mean(b), "ratio": statistics.mean(b) / statistics.mean(a),
            "spread_without": (max(a) - min(a)) / statistics.mean(a)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-seconds", type=float, default=60.0)
    ap.add_argument("--phase-seconds", type=float, default=8.0)
    ap.add_argument("--pairs", type=int, default=2, help="A-B-B-A groups")
    ap.add_argument("--stress-interval", type=float, default=0.0,
                    help="also measure CPU at this (shorter) interval; 0 to skip")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gpueff-ovh-")
    res: dict[str, Any] = {}
    costs = nvml_call_costs()
    res["nvml_call_costs"] = costs
    n_gpus = costs["_gpus"]["count"]
    print(f"{'call (per call)':40} {'wall us':>9} {'CPU us':>9}")
    for k, v in costs.items():
        if not k.startswith("_"):
            print(f"{k:40} {v['wall_us']:9.1f} {v['cpu_us']:9.1f}")
    ub = costs["_util_buffer"]
    print(f"utilization sample buffer: {ub['samples']} readings over {ub['span_s']:.1f} s")
    res["state_write"] = state_write_costs()
    for k, v in res["state_write"].items():
        print(f"{'write ' + k:40} {v['wall_us']:9.1f} {v['cpu_us']:9.1f}")
    res["tick_profile"] = tick_profile(tmp)
    print(f"\nagent tick (1 GPU, in-process): CPU mean {res['tick_profile']['tick_cpu_ms_mean']:.2f} ms, "
          f"median {res['tick_profile']['tick_cpu_ms_median']:.2f} ms")
    print("\n".join(res["tick_profile"]["profile"].splitlines()[:22]))
    print(flush=True)
    res["cpu_default"] = agent_cpu(tmp, 5.0, args.cpu_seconds, n_gpus)
    if args.stress_interval:
        res["cpu_stress"] = agent_cpu(tmp, args.stress_interval, min(30.0, args.cpu_seconds), n_gpus)
    for key in ("cpu_default", "cpu_stress"):
        if key in res:
            r = res[key]
            print(f"agent CPU at {r['interval_s']:g} s interval over {r['wall_s']:.0f} s ({r['ticks']} ticks, "
                  f"{r['gpus']} GPU): {r['cpu_s_self']:.3f} CPU-s (proc/stat {r['cpu_s_proc_stat']:.2f}) = "
                  f"{r['cpu_s_per_gpu_hour']:.2f} CPU-s per GPU-hour = {r['pct_core_per_gpu']:.4f} % of a core "
                  f"per GPU; tick CPU median {r['tick_cpu_ms_median']:.2f} ms, max {r['tick_cpu_ms_max']:.2f} ms",
                  flush=True)
    mm = matmul_phases(tmp, 5.0, args.phase_seconds, args.pairs)
    res["matmul_default"] = mm
    print("\nbf16 8192^2 matmul, phases in order:")
    for p in mm["sequence"]:
        print(f"  {'with agent   ' if p['agent'] else 'without agent'} {p['tflops']:8.1f} TFLOP/s")
    print(f"mean without {mm['mean_without']:.1f}, with {mm['mean_with']:.1f} TFLOP/s: kept "
          f"{100 * mm['ratio']:.2f} % (goal >= 99.5 %); spread between baseline phases "
          f"{100 * mm['spread_without']:.2f} %")
    c = res["cpu_default"]
    print(f"\nSUMMARY: agent {c['pct_core_per_gpu']:.4f} % of one core per GPU at 5 s (goal <= 0.1 %): "
          f"{'PASS' if c['pct_core_per_gpu'] <= 0.1 else 'FAIL'}; matmul kept {100 * mm['ratio']:.2f} % "
          f"(goal >= 99.5 %): {'PASS' if mm['ratio'] >= 0.995 else 'FAIL'}")
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "agent_overhead.json"), "w") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
