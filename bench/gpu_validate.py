#!/usr/bin/env python3
"""Validate the nvml backend on a real GPU: known workloads as 'jobs', measured through the real agent.

For each workload (idle, one-block spin, tiny-kernel loop, fp32 matmul with TF32 off, 1 GiB copies,
bf16 matmul) a child process runs it on one GPU; once it is warm, the job's window is measured:

* ``--mode collector``: NvmlCollector.start() ... sleep ... NvmlCollector.stop() (no Slurm parts);
* ``--mode pipeline``: the real ``hooks/prolog`` and ``hooks/epilog`` with a Slurm-like environment
  (backend "nvml"), the spool record they write, then -- where sqlmodel is importable -- ``gpueff
  ingest`` and ``seff-gpu JOBID`` (card printed, ``--json`` saved).

The agent is the real one (``python3 -m slurm_gpueff.cli.gpueff agent``) in its own process. A table of
kernel / SM / tensor / DRAM / FP32 % per workload is printed; JSON results go to ``--out`` ($OUT).

Run (repo root, on a GPU node):  ``PYTHONPATH=. python3 bench/gpu_validate.py --interval 1 --seconds 20``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpu_kernels import SPIN_SRC, clock_khz  # noqa: E402  (bench/, this script's own directory)

WORKLOADS = ("idle", "spin", "tiny", "fp32", "copy", "bf16")  # the default set; also: fp64, int8, tf32, fp8
# Expected on an H100 (GPU-APIS.md, 5 s windows): kernel, SM, tensor, DRAM, FP32 in %.
EXPECTED = {
    "idle": "util 0",
    "spin": "util 100 / SM 0.76",
    "tiny": "util 23 / SM 0.04",
    "fp32": "SM 79 / tensor 0 / FP32 63",
    "copy": "SM 80 / DRAM 44",
    "bf16": "util 87 / SM 82 / tensor 80 / DRAM 20",
    "fp64": "tensor 86 = DFMA (FP64 DGEMM)",
    "int8": "tensor 12 = IMMA (torch._int_mm)",
    "tf32": "HMMA 75 (FP32 matmul, TF32 on)",
    "fp8": "HMMA 72 (torch._scaled_mm, e4m3)",
}

# ------------------------------------------------------------------------------------------------
# child: run one workload until told to stop
def child(workload: str, gpu: int) -> None:
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    import torch

    torch.cuda.set_device(gpu)
    dev = torch.device("cuda", gpu)
    step: Any
    if workload == "idle":
        torch.zeros(1, device=dev)  # a context, nothing running

        def step() -> None:
            time.sleep(0.2)
    elif workload == "spin":
        import cupy as cp

        cp.cuda.Device(gpu).use()
        kern = cp.RawKernel(SPIN_SRC, "spin")
        rate_khz = clock_khz(cp, gpu)
        cycles = int(rate_khz * 1000 * 0.25)  # ~0.25 s a launch, one block of one thread

        def step() -> None:
            for _ in range(4):
                kern((1,), (1,), (cp.int64(cycles),))
            cp.cuda.Device(gpu).synchronize()
    elif workload == "tiny":
        a = torch.zeros(1000, device=dev)

        def step() -> None:
            for _ in range(2000):
                a.add_(1.0)
            torch.cuda.synchronize()
    elif workload in ("fp32", "bf16"):
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        dt = torch.float32 if workload == "fp32" else torch.bfloat16
        x = torch.randn(8192, 8192, device=dev, dtype=dt)
        y = torch.randn(8192, 8192, device=dev, dtype=dt)
        out = torch.empty(8192, 8192, device=dev, dtype=dt)

        def step() -> None:
            for _ in range(10):
                torch.matmul(x, y, out=out)
            torch.cuda.synchronize()
    elif workload == "tf32":  # FP32 tensors, TF32 matrix math: the HMMA pipe, as FP16/BF16
        torch.backends.cuda.matmul.allow_tf32 = True
        x = torch.randn(8192, 8192, device=dev)
        y = torch.randn(8192, 8192, device=dev)
        out = torch.empty(8192, 8192, device=dev)

        def step() -> None:
            for _ in range(10):
                torch.matmul(x, y, out=out)
            torch.cuda.synchronize()
    elif workload == "fp8":  # FP8 matrix math (Hopper): the HMMA pipe too
        a8 = torch.randn(8192, 8192, device=dev).to(torch.float8_e4m3fn)
        b8 = torch.randn(8192, 8192, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as _scaled_mm needs
        one = torch.tensor(1.0, device=dev)

        def step() -> None:
            for _ in range(20):
                torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
    elif workload == "fp64":
        a64 = torch.randn(8192, 8192, device=dev, dtype=torch.float64)
        b64 = torch.randn(8192, 8192, device=dev, dtype=torch.float64)

        def step() -> None:
            for _ in range(2):
                torch.matmul(a64, b64)
            torch.cuda.synchronize()
    elif workload == "int8":
        a8 = torch.randint(-64, 64, (8192, 8192), device=dev, dtype=torch.int8)
        b8 = torch.randint(-64, 64, (8192, 8192), device=dev, dtype=torch.int8)

        def step() -> None:
            for _ in range(10):
                torch._int_mm(a8, b8)
            torch.cuda.synchronize()
    elif workload == "copy":
        n = (1 << 30) // 4
        src = torch.randn(n, device=dev)
        dst = torch.empty_like(src)

        def step() -> None:
            for _ in range(10):
                dst.copy_(src)
            torch.cuda.synchronize()
    else:
        raise SystemExit(f"unknown workload {workload}")
    step()  # warm: compile, allocate, first launch
    print("READY", flush=True)
    while not stop:
        step()


# ------------------------------------------------------------------------------------------------
# parent
def write_config(tmp: str, interval: float, backend: str = "nvml") -> str:
    path = os.path.join(tmp, "gpueff.toml")
    with open(path, "w") as fh:
        fh.write(f'[site]\ncluster = "gpuval"\n[paths]\nstate_dir = "{tmp}/state"\nspool_dir = "{tmp}/spool"\n'
                 f'database = "sqlite:///{tmp}/gpueff.db"\n'
                 f'[collector]\nbackend = "{backend}"\nagent_stale_s = {max(30.0, 4 * interval)}\n'
                 f'[agent]\ninterval_s = {interval}\ntimeline_interval_s = {max(5.0, 5 * interval)}\n')
    return path


def start_agent(cfg_path: str, state_dir: str, log_path: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    logf = open(log_path, "ab")  # noqa: SIM115 - lives as long as the agent
    proc = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "agent", "--config", cfg_path],
                            env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    path = os.path.join(state_dir, "agent", "state.json")
    deadline = time.time() + 60
    while time.time() < deadline:
        if proc.poll() is not None:
            with open(log_path) as fh:
                raise SystemExit(f"agent exited with {proc.returncode}; see {log_path}:\n" + fh.read())
        try:
            with open(path) as fh:
                if json.load(fh).get("ticks", 0) >= 2:
                    return proc
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("agent wrote no state within 60 s")


def stop_agent(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        return -9


def slurm_index_for(state_dir: str, gpu_nvml_index: int, dev_dir: str) -> tuple[int, str]:
    """Slurm's index of the GPU at NVML index ``gpu_nvml_index``, and the /dev dir to use for mapping.

    Slurm indexes GPUs by sorted /dev/nvidiaN; where this machine has no such nodes (some VMs), we build
    a stand-in directory from the agent's minor numbers (noted in the results).
    """
    from slurm_gpueff.collectors.base import device_minors

    with open(os.path.join(state_dir, "agent", "state.json")) as fh:
        st = json.load(fh)
    minor = next(g["minor"] for g in st["gpus"].values() if g["index"] == gpu_nvml_index)
    minors = device_minors("/dev")
    if minor in minors:
        return minors.index(minor), "/dev"
    os.makedirs(dev_dir, exist_ok=True)
    for g in st["gpus"].values():
        if g["minor"] is not None:
            open(os.path.join(dev_dir, f"nvidia{g['minor']}"), "w").close()
    return device_minors(dev_dir).index(minor), dev_dir


def run_child(workload: str, gpu: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", workload, "--gpu", str(gpu)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "READY" not in line:
        proc.kill()
        raise RuntimeError(f"workload {workload} did not start (rc={proc.wait()})")
    return proc


def end_child(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure_collector(cfg: Any, workload: str, gpu: int, slurm_idx: int, dev_dir: str, seconds: float,
                      warm: float, job_id: int) -> dict[str, Any]:
    from slurm_gpueff.collectors.base import JobContext
    from slurm_gpueff.collectors.nvml import NvmlCollector

    coll = NvmlCollector(cfg, dev_dir=dev_dir)
    proc = run_child(workload, gpu)
    try:
        time.sleep(warm)  # at least one agent tick inside the workload before the window starts
        job = JobContext(job_id, "gpuval", "gpuval", [slurm_idx], start_time=time.time())
        st = coll.start(job)
        jobs = os.path.join(cfg.paths.state_dir, "jobs")
        os.makedirs(jobs, exist_ok=True)
        with open(os.path.join(jobs, f"{job_id}.json"), "w") as fh:  # what the Prolog saves
            json.dump({"start": st, "start_time": job.start_time, "gpus": [slurm_idx]}, fh)
        time.sleep(seconds)
        job.end_time = time.time()
        m = coll.stop(job, json.loads(json.dumps(st)))
        os.unlink(os.path.join(jobs, f"{job_id}.json"))
    finally:
        end_child(proc)
    return {"workload": workload, "backend": m.backend, "reason": m.reason, "gpu": m.gpus[0],
            "window_s": job.end_time - job.start_time}


def slurm_env(job_id: int, slurm_idx: int, cfg_path: str, kind: str) -> dict[str, str]:
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_GPUS": str(slurm_idx), "CUDA_VISIBLE_DEVICES": str(slurm_idx),
           "SLURMD_NODENAME": "gpuval", "SLURM_CLUSTER_NAME": "gpuval", "SLURM_JOB_USER": "root",
           "SLURM_JOB_UID": "0", "SLURM_JOB_ACCOUNT": "bench", "SLURM_JOB_PARTITION": "gpu",
           "GPUEFF_CONFIG": cfg_path}
    if kind == "epilog":
        env.update({"SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_EXIT_CODE": "0"})
    return env


def measure_pipeline(cfg: Any, cfg_path: str, workload: str, gpu: int, slurm_idx: int, seconds: float,
                     warm: float, job_id: int, out_dir: str) -> dict[str, Any]:
    proc = run_child(workload, gpu)
    try:
        time.sleep(warm)
        for kind in ("prolog", "epilog"):
            r = subprocess.run([sys.executable, os.path.join(ROOT, "hooks", kind)],
                               env=slurm_env(job_id, slurm_idx, cfg_path, kind), capture_output=True, text=True,
                               timeout=60)
            if r.returncode != 0 or r.stderr.strip():
                print(f"  {kind} rc={r.returncode} stderr: {r.stderr.strip()}")
            if kind == "prolog":
                time.sleep(seconds)
    finally:
        end_child(proc)
    from slurm_gpueff import spool

    path = os.path.join(cfg.paths.spool_dir, spool.INCOMING, spool.record_name(job_id, "gpuval"))
    with open(path) as fh:
        rec = json.load(fh)
    res = {"workload": workload, "backend": rec["backend"], "reason": rec["reason"], "gpu": rec["gpus"][0],
           "window_s": rec["end_time"] - rec["start_time"], "record": rec}
    return res


def ingest_and_seff(cfg_path: str, job_ids: dict[str, int], out_dir: str) -> dict[str, Any]:
    try:
        import sqlmodel  # noqa: F401
    except ImportError:
        print("\n(sqlmodel is not importable here: skipping `gpueff ingest` and `seff-gpu`)")
        return {"skipped": "sqlmodel not importable"}
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               GPUEFF_CONFIG=cfg_path)
    r = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "ingest"], env=env,
                       capture_output=True, text=True, timeout=120)
    print("\n$ gpueff ingest\n" + r.stdout + r.stderr)
    cards: dict[str, Any] = {"ingest_rc": r.returncode}
    for w, jid in job_ids.items():
        r = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", str(jid)], env=env,
                           capture_output=True, text=True, timeout=60)
        print(f"\n$ seff-gpu {jid}   # {w}\n{r.stdout}{r.stderr}")
        rj = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "--json", str(jid)], env=env,
                            capture_output=True, text=True, timeout=60)
        try:
            cards[w] = json.loads(rj.stdout)
        except ValueError:
            cards[w] = {"rc": rj.returncode, "stdout": rj.stdout, "stderr": rj.stderr}
    if out_dir:
        with open(os.path.join(out_dir, "seff_cards.json"), "w") as fh:
            json.dump(cards, fh, indent=1)
    return cards


def pipeline_failures(cards: dict[str, Any], job_ids: dict[str, int]) -> list[str]:
    """The pipeline must end in a card for every job; the spin kernel's must say "busy but not working"."""
    if "skipped" in cards:
        return []
    bad = [] if cards.get("ingest_rc") == 0 else [f"gpueff ingest exited {cards.get('ingest_rc')}"]
    for w in job_ids:
        jobs = (cards.get(w) or {}).get("jobs") or []
        if not jobs:
            bad.append(f"seff-gpu gave no card for {w}: {cards.get(w)}")
        elif w == "spin" and (jobs[0]["job"].get("measured_s") or 0) < 60:  # analysis.short_job_s
            if not any("too short to judge" in n["reason"] for n in jobs[0]["not_assessed"]):
                bad.append(f"spin: a window under 60 s without 'too short to judge': {jobs[0]['not_assessed']}")
        elif w == "spin" and [v["name"] for v in jobs[0]["verdicts"]][:1] != ["busy_not_working"]:
            bad.append(f"spin: primary verdict {jobs[0]['verdicts'][:1]} is not busy_not_working")
    return bad


def pct(v: Any, nd: int = 1) -> str:
    return "n/a" if v is None else f"{100 * v:.{nd}f}"


def print_table(results: list[dict[str, Any]]) -> None:
    hdr = (f"{'workload':8} {'kernel%':>8} {'SM%':>7} {'occ%':>6} {'tensor%':>8} {'HMMA%':>6} {'IMMA%':>6} "
           f"{'DFMA%':>6} {'DRAM%':>6} {'FP32%':>6} {'FP16%':>6} {'W':>6} {'J':>8} {'peakGiB':>8} {'n':>4}  expected")
    print(hdr)
    print("-" * len(hdr))
    for r in results:
        g = r["gpu"]
        mem = g.get("memory_used_peak_bytes")
        watts = "n/a" if g["power_mean_w"] is None else f"{g['power_mean_w']:.0f}"
        joules = "n/a" if g["energy_j"] is None else f"{g['energy_j']:.0f}"
        gib = "n/a" if mem is None else f"{mem / 2**30:.2f}"
        print(f"{r['workload']:8} {pct(g['kernel_active']):>8} {pct(g['sm_active'], 2):>7} "
              f"{pct(g['sm_occupancy'], 2):>6} {pct(g['tensor_active']):>8} {pct(g.get('hmma_active')):>6} "
              f"{pct(g.get('imma_active')):>6} {pct(g.get('dfma_active')):>6} {pct(g['dram_active']):>6} "
              f"{pct(g['fp32_active']):>6} {pct(g['fp16_active']):>6} {watts:>6} {joules:>8} {gib:>8} "
              f"{g['samples']:>4}  {EXPECTED[r['workload']]}")


def checks(results: list[dict[str, Any]]) -> list[str]:
    """The claims this backend exists for; returns failures (empty = all good)."""
    by = {r["workload"]: r["gpu"] for r in results}
    bad = []

    def need(cond: bool, what: str) -> None:
        print(("PASS " if cond else "FAIL ") + what)
        if not cond:
            bad.append(what)

    if "spin" in by:
        g = by["spin"]
        need((g["kernel_active"] or 0) >= 0.95, f"spin: kernel-active >= 95 % ({pct(g['kernel_active'])})")
        need(g["sm_active"] is not None and g["sm_active"] < 0.02, f"spin: SM-active < 2 % ({pct(g['sm_active'], 2)})")
    if "bf16" in by:
        g = by["bf16"]
        need((g["tensor_active"] or 0) >= 0.5, f"bf16: tensor-active >= 50 % ({pct(g['tensor_active'])})")
    if "fp32" in by:
        g = by["fp32"]
        need(g["tensor_active"] is not None and g["tensor_active"] < 0.02,
             f"fp32 (TF32 off): tensor-active < 2 % ({pct(g['tensor_active'])})")
        need((g["fp32_active"] or 0) >= 0.3, f"fp32: FP32-active >= 30 % ({pct(g['fp32_active'])})")
    if "fp64" in by:
        g = by["fp64"]
        need((g.get("dfma_active") or 0) >= 0.5 and (g.get("hmma_active") or 0) < 0.02,
             f"fp64: DFMA >= 50 %, HMMA < 2 % ({pct(g.get('dfma_active'))} / {pct(g.get('hmma_active'))})")
    if "int8" in by:
        g = by["int8"]
        need((g.get("imma_active") or 0) >= 0.05 and (g.get("hmma_active") or 0) < 0.02,
             f"int8: IMMA >= 5 %, HMMA < 2 % ({pct(g.get('imma_active'))} / {pct(g.get('hmma_active'))})")
    for name in ("tf32", "fp8"):  # the card names the HMMA pipe "FP16/BF16/TF32/FP8": it must read there
        if name in by:
            g = by[name]
            need((g.get("hmma_active") or 0) >= 0.5 and (g["tensor_active"] or 0) >= 0.5,
                 f"{name}: HMMA >= 50 % and tensor-active >= 50 % ({pct(g.get('hmma_active'))} / "
                 f"{pct(g['tensor_active'])})")
    if "bf16" in by and "hmma_active" in by["bf16"]:
        g = by["bf16"]
        need((g.get("hmma_active") or 0) >= 0.5, f"bf16: HMMA >= 50 % ({pct(g.get('hmma_active'))})")
    if "copy" in by:
        g = by["copy"]
        need((g["dram_active"] or 0) >= 0.3, f"copy: DRAM-active >= 30 % ({pct(g['dram_active'])})")
    if "idle" in by:
        g = by["idle"]
        need(g["kernel_active"] is not None and g["kernel_active"] < 0.02,
             f"idle: kernel-active < 2 % ({pct(g['kernel_active'])})")
    if "tiny" in by:
        g = by["tiny"]
        need(g["sm_active"] is not None and g["sm_active"] < 0.05 and (g["kernel_active"] or 0) > 0.05,
             f"tiny: kernel-active > 5 % and SM < 5 % ({pct(g['kernel_active'])} / {pct(g['sm_active'], 2)})")
    for r in results:
        g = r["gpu"]
        need(g["energy_j"] is not None and g["memory_used_peak_bytes"] is not None and g["samples"] > 0,
             f"{r['workload']}: energy, peak memory and samples present")
    return bad


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to load (default 0)")
    ap.add_argument("--mode", choices=("collector", "pipeline"), default="collector",
                    help="(exact windows, agent restarts, back-to-back jobs: bench/gpu_exact.py)")
    ap.add_argument("--interval", type=float, default=None, help="agent.interval_s (default 1)")
    ap.add_argument("--seconds", type=float, default=20.0, help="measured window per workload")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="directory for JSON results (default $OUT)")
    ap.add_argument("--tag", default="", help="suffix for the result file names")
    args = ap.parse_args()
    if args.child:
        child(args.child, args.gpu)
        return 0
    args.interval = args.interval or 1.0
    from slurm_gpueff.config import load

    tmp = tempfile.mkdtemp(prefix="gpueff-val-")
    cfg_path = write_config(tmp, args.interval)
    cfg = load(cfg_path)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
    tag = args.tag or f"{args.mode}-{args.interval:g}s"
    agent_log = os.path.join(tmp, "agent.log")
    agent = start_agent(cfg_path, cfg.paths.state_dir, agent_log)
    results: list[dict[str, Any]] = []
    job_ids: dict[str, int] = {}
    try:
        slurm_idx, dev_dir = slurm_index_for(cfg.paths.state_dir, args.gpu, os.path.join(tmp, "dev"))
        warm = max(2.0, 1.5 * args.interval + 0.5)
        print(f"agent interval {args.interval:g} s, window {args.seconds:g} s, warm-up {warm:g} s, "
              f"mode {args.mode}, Slurm index {slurm_idx} (minor map from {dev_dir})", flush=True)
        for n, w in enumerate(args.workloads.split(",")):
            job_id = 900000 + n + 1
            t0 = time.time()
            if args.mode == "collector":
                r = measure_collector(cfg, w, args.gpu, slurm_idx, dev_dir, args.seconds, warm, job_id)
            else:
                if dev_dir != "/dev":
                    print("note: no /dev/nvidiaN here, the hooks map Slurm index -> minor through /dev: "
                          "results may say 'no device'")
                r = measure_pipeline(cfg, cfg_path, w, args.gpu, slurm_idx, args.seconds, warm, job_id, args.out)
            job_ids[w] = job_id
            results.append(r)
            print(f"  {w}: done in {time.time() - t0:.1f} s ({r['backend']}; reason: {r['reason']})", flush=True)
    finally:
        rc = stop_agent(agent)
    with open(os.path.join(cfg.paths.state_dir, "agent", "state.json")) as fh:
        final = json.load(fh)
    with open(agent_log) as fh:
        print("agent log (last lines):\n  " + "  ".join(fh.readlines()[-5:]))
    print(f"agent exit {rc}; {final['ticks']} ticks; last tick CPU {1e3 * (final['prev_tick_cpu_s'] or 0):.2f} ms, "
          f"wall {1e3 * (final['prev_tick_wall_s'] or 0):.2f} ms\n")
    print_table(results)
    print()
    bad = checks(results)
    extra: dict[str, Any] = {}
    if args.mode == "pipeline":
        extra = ingest_and_seff(cfg_path, job_ids, args.out)
        bad += pipeline_failures(extra, job_ids)
        for b in bad:
            print(f"FAIL {b}")
    if args.out:
        with open(os.path.join(args.out, f"gpu_validate-{tag}.json"), "w") as fh:
            json.dump({"interval_s": args.interval, "window_s": args.seconds, "mode": args.mode,
                       "results": results, "failures": bad, "agent_exit": rc, "extra": extra,
                       "agent_state_final": {k: final[k] for k in ("ticks", "cpu_s", "prev_tick_cpu_s",
                                                                   "prev_tick_wall_s", "energy_interval_s")}},
                      fh, indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{len(bad)} check(s) failed" if bad else "\nall checks passed")
    return 1 if bad or rc != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
