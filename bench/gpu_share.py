#!/usr/bin/env python3
"""Two jobs on one GPU, measured through the real agent, hooks and records, against a truth built in the run.

Phase S (shared): jobs A and B are Prolog'd on the same GPU by the real ``hooks/prolog``; each runs its own
process tree (a child of this script with its own ``SLURM_JOB_ID``, as Slurm's tasks have; on a machine
without Slurm's cgroups the agent maps processes by that environment, owner checked). The two loads differ
(A: bf16 matmul, tensor cores; B: FP32 matmul with TF32 off, no tensor cores) and run in disjoint time
slots (A, B, A, idle, B, A; ``--slot`` seconds each), so the truth is known: this script reads GPM and the
energy counter itself once a second and gives each second to the job whose slot it is. The real
``hooks/epilog`` then writes each job's record, and the check is:

* each job's kernel, SM and tensor activity within 5 points of its truth (its slots' device activity over
  the whole window), its energy within 5 % of its truth (its slots' energy plus half of the idle slot's);
* A's + B's activity (plus what was unattributed) within 2 points of the device's over the window.

Phase A (alone): each load as a job alone on the GPU: no split, figures as the device's.
Phase M (MPS, where ``nvidia-cuda-mps-control`` exists): both loads at once as MPS clients; what NVML
lists (compute processes, MPS compute processes, per-process utilization samples) and what the split gives.
The agent runs at its defaults (5-s readings, 1-s GPM steps); its CPU over phase S is reported per GPU.

Run (repo root, on a GPU node):  ``PYTHONPATH=. python3 bench/gpu_share.py [--out DIR]``
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
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from gpu_validate import end_child as end  # noqa: E402  (bench/)
from gpu_validate import slurm_index_for, start_agent, stop_agent  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
LOADS = {"A": "bf16", "B": "fp32"}
SLOTS = ("A", "B", "A", "idle", "B", "A")
METRICS = {"kernel_active": "NVML_GPM_METRIC_GRAPHICS_UTIL", "sm_active": "NVML_GPM_METRIC_SM_UTIL",
           "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL"}


# ------------------------------------------------------------------------------------------------
# child: one job's process, working only inside its slots
def child(load: str, gpu: int, windows: list[tuple[float, float]]) -> None:
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    import torch

    torch.cuda.set_device(gpu)
    torch.backends.cuda.matmul.allow_tf32 = False
    dt = torch.bfloat16 if load == "bf16" else torch.float32
    x = torch.randn(8192, 8192, device="cuda", dtype=dt)
    y = torch.randn(8192, 8192, device="cuda", dtype=dt)
    out = torch.empty(8192, 8192, device="cuda", dtype=dt)
    n = 4 if load == "bf16" else 1  # about 20 ms a step either way, so a slot's edge is sharp

    def step() -> None:
        for _ in range(n):
            torch.matmul(x, y, out=out)
        torch.cuda.synchronize()

    step()
    print("READY", flush=True)
    while not stop:
        now = time.time()
        if any(a <= now < b for a, b in windows):
            step()
        else:
            time.sleep(0.005)


def start_child(load: str, gpu: int, windows: list[tuple[float, float]], job_id: int,
                extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    env = dict(os.environ, SLURM_JOB_ID=str(job_id), **(extra_env or {}))
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", load, "--gpu", str(gpu),
                             "--windows", json.dumps(windows)], stdout=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    line = proc.stdout.readline() if proc.stdout else ""
    if "READY" not in line:
        proc.kill()
        raise SystemExit(f"load {load} did not start (rc={proc.wait()})")
    return proc


# ------------------------------------------------------------------------------------------------
# the reference: GPM and the energy counter read by this script once a second
class Reference(threading.Thread):
    def __init__(self, gpu: int) -> None:
        super().__init__(daemon=True)
        import pynvml as nv

        self.nv = nv
        nv.nvmlInit()
        self.h = nv.nvmlDeviceGetHandleByIndex(gpu)
        self.ids = [(m, getattr(nv, c)) for m, c in METRICS.items()]
        self.rows: list[dict[str, Any]] = []  # {t0, t1, dE_j, metric: fraction}
        self.halt = threading.Event()

    def run(self) -> None:
        nv = self.nv
        s = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
        nv.nvmlGpmSampleGet(self.h, s[0])
        t_prev, e_prev = time.time(), nv.nvmlDeviceGetTotalEnergyConsumption(self.h)
        while not self.halt.wait(1.0):
            nv.nvmlGpmSampleGet(self.h, s[1])
            t, e = time.time(), nv.nvmlDeviceGetTotalEnergyConsumption(self.h)
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(self.ids)
            mg.sample1, mg.sample2 = s[0], s[1]
            for i, (_m, mid) in enumerate(self.ids):
                mg.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
            row = {"t0": t_prev, "t1": t, "energy_j": (e - e_prev) / 1000.0}
            for i, (m, _mid) in enumerate(self.ids):
                row[m] = float(mg.metrics[i].value) / 100.0
            self.rows.append(row)
            s.reverse()
            t_prev, e_prev = t, e

    def stop(self) -> None:
        self.halt.set()
        self.join(timeout=5)


def owner(t: float, t0: float, slot: float) -> str:
    i = int((t - t0) // slot)
    return SLOTS[i] if 0 <= i < len(SLOTS) else "idle"


def truth(rows: list[dict[str, Any]], w0: float, w1: float, t0: float, slot: float) -> dict[str, Any]:
    """Per job and for the device: mean activity over [w0, w1] (seconds of the job's slots only), energy."""
    inside = [r for r in rows if r["t1"] > w0 and r["t0"] < w1]
    span = sum(min(r["t1"], w1) - max(r["t0"], w0) for r in inside)
    out: dict[str, Any] = {"window_s": span}
    for who in ("A", "B", "device"):
        d: dict[str, float] = {}
        for m in METRICS:
            tot = 0.0
            for r in inside:
                part = min(r["t1"], w1) - max(r["t0"], w0)
                mid = (max(r["t0"], w0) + min(r["t1"], w1)) / 2
                if who == "device" or owner(mid, t0, slot) == who:
                    tot += r[m] * part
            d[m] = tot / span if span else float("nan")
        e = 0.0
        for r in inside:
            frac = (min(r["t1"], w1) - max(r["t0"], w0)) / max(r["t1"] - r["t0"], 1e-9)
            mid = (max(r["t0"], w0) + min(r["t1"], w1)) / 2
            o = owner(mid, t0, slot)
            share = 1.0 if who in ("device", o) else 0.5 if o == "idle" else 0.0
            e += r["energy_j"] * frac * share
        d["energy_j"] = e
        out[who] = d
    return out


# ------------------------------------------------------------------------------------------------
def write_config(tmp: str, interval_s: float | None = None) -> str:
    path = os.path.join(tmp, "gpueff.toml")
    with open(path, "w") as fh:  # the agent at its defaults (5-s readings, 1-s GPM steps) unless --interval
        fh.write(f'[site]\ncluster = "gpushare"\n[paths]\nstate_dir = "{tmp}/state"\nspool_dir = "{tmp}/spool"\n'
                 '[collector]\nbackend = "nvml"\n' + (f"[agent]\ninterval_s = {interval_s}\n" if interval_s else ""))
    return path


def hook(kind: str, job_id: int, slurm_idx: int, cfg_path: str) -> None:
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_GPUS": str(slurm_idx), "CUDA_VISIBLE_DEVICES": str(slurm_idx),
           "SLURMD_NODENAME": "gpushare", "SLURM_CLUSTER_NAME": "gpushare", "SLURM_JOB_USER": "root",
           "SLURM_JOB_UID": "0", "SLURM_JOB_ACCOUNT": "bench", "SLURM_JOB_PARTITION": "gpu",
           "GPUEFF_CONFIG": cfg_path, "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if kind == "epilog":
        env.update({"SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_EXIT_CODE": "0"})
    r = subprocess.run([sys.executable, os.path.join(ROOT, "hooks", kind)], env=env, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0 or r.stderr.strip():
        print(f"  {kind} {job_id} rc={r.returncode} stderr: {r.stderr.strip()}")


def record_gpu(cfg_path: str, job_id: int) -> dict[str, Any]:
    from slurm_gpueff import spool
    from slurm_gpueff.config import load

    cfg = load(cfg_path)
    with open(os.path.join(cfg.paths.spool_dir, spool.INCOMING, spool.record_name(job_id, "gpushare"))) as fh:
        rec = json.load(fh)
    return rec["gpus"][0] | {"_window": [rec["start_time"], rec["end_time"]]}


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        f = fh.read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / CLK_TCK


def pts(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:6.2f}"


def phase_shared(cfg_path: str, gpu: int, idx: int, slot: float, agent_pid: int, ref: Reference,
                 ids: tuple[int, int], checks: list[str], extra_env: dict[str, str] | None = None,
                 label: str = "S") -> dict[str, Any]:
    t0 = time.time() + 20.0  # the children warm up and both Prologs run before the first slot
    wins = {who: [(t0 + i * slot, t0 + (i + 1) * slot) for i, s in enumerate(SLOTS) if s == who] for who in LOADS}
    kids = {who: start_child(LOADS[who], gpu, wins[who], ids[i], extra_env) for i, who in enumerate(LOADS)}
    try:
        while time.time() < t0 - 1.0:
            time.sleep(0.1)
        for j in ids:
            hook("prolog", j, idx, cfg_path)
        w0 = time.time()
        cpu0 = proc_cpu_s(agent_pid)
        while time.time() < t0 + slot * len(SLOTS):
            time.sleep(0.1)
        cpu1, w_end = proc_cpu_s(agent_pid), time.time()
        for j in ids:
            hook("epilog", j, idx, cfg_path)
        w1 = time.time()
    finally:
        for k in kids.values():
            end(k)
    time.sleep(1.5)
    recs = {who: record_gpu(cfg_path, j) for who, j in zip(LOADS, ids, strict=True)}
    tr = truth(ref.rows, w0, w1, t0, slot)
    print(f"\nPhase {label}: A ({LOADS['A']}) and B ({LOADS['B']}) share GPU {gpu} in slots {'/'.join(SLOTS)} "
          f"of {slot:g} s; window {tr['window_s']:.1f} s")
    print(f"  {'figure':<14} {'A rec':>7} {'A truth':>7} {'B rec':>7} {'B truth':>7} {'A+B+un':>7} {'device':>7}")
    un = (recs["A"].get("shared") or {}).get("unattributed") or 0.0  # of the GPU's kernel time: no job's
    for m in METRICS:
        a, b = recs["A"].get(m), recs["B"].get(m)
        tot = (a or 0.0) + (b or 0.0) + (un if m == "kernel_active" else 0.0)
        print(f"  {m:<14} {pts(a)} {pts(tr['A'][m])} {pts(b)} {pts(tr['B'][m])} {pts(tot)} {pts(tr['device'][m])}")
        if label == "S":
            for who, v in (("A", a), ("B", b)):
                if v is None or abs(v - tr[who][m]) > 0.05:
                    checks.append(f"{label}: {who} {m} {pts(v)} vs truth {pts(tr[who][m])} (> 5 points)")
            if abs(tot - tr["device"][m]) > 0.02:
                checks.append(f"{label}: A+B+unattributed {m} {pts(tot)} vs device {pts(tr['device'][m])} (> 2 points)")
    for who in LOADS:
        e, t = recs[who].get("energy_j"), tr[who]["energy_j"]
        err = (e - t) / t if e is not None and t else None
        print(f"  energy {who}: record {e} J, truth {t:.1f} J ({'n/a' if err is None else f'{100 * err:+.2f} %'})")
        if label == "S" and (err is None or abs(err) > 0.05):
            checks.append(f"{label}: {who} energy {e} J vs truth {t:.1f} J (> 5 %)")
    print(f"  device energy over the window {tr['device']['energy_j']:.1f} J; records' sum "
          f"{sum(recs[w].get('energy_j') or 0.0 for w in LOADS):.1f} J")
    for who in LOADS:
        print(f"  {who} shared: {json.dumps(recs[who].get('shared'))}")
    cpu_pct = 100.0 * (cpu1 - cpu0) / (w_end - w0)
    return {"truth": tr, "records": recs, "agent_cpu_pct": cpu_pct, "agent_cpu_window_s": w_end - w0}


def phase_alone(cfg_path: str, gpu: int, idx: int, ref: Reference, seconds: float, checks: list[str]) -> dict:
    out = {}
    print("\nPhase A: each load alone on the GPU")
    for i, who in enumerate(LOADS):
        job_id = 9103 + i
        kid = start_child(LOADS[who], gpu, [(0.0, 4e9)], job_id)
        try:
            time.sleep(6)
            hook("prolog", job_id, idx, cfg_path)
            w0 = time.time()
            time.sleep(seconds)
            hook("epilog", job_id, idx, cfg_path)
            w1 = time.time()
        finally:
            end(kid)
        time.sleep(1.5)
        rec = record_gpu(cfg_path, job_id)
        tr = truth(ref.rows, w0, w1, w0, 1e9)["device"]
        line = "  ".join(f"{m} {pts(rec.get(m))} (device {pts(tr[m])})" for m in METRICS)
        print(f"  {who} alone ({LOADS[who]}): {line}; shared: {rec.get('shared')}")
        if "shared" in rec:
            checks.append(f"alone: {who}'s record says shared")
        out[who] = {"record": rec, "device": tr}
    return out


def mps_probe(gpu: int) -> dict[str, Any]:
    """What NVML lists while two MPS clients run: compute processes, MPS compute processes, utilization samples."""
    import pynvml as nv

    h = nv.nvmlDeviceGetHandleByIndex(gpu)
    out: dict[str, Any] = {}
    for name in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetMPSComputeRunningProcesses"):
        try:
            out[name] = [{"pid": p.pid, "usedGpuMemory": p.usedGpuMemory} for p in getattr(nv, name)(h)]
        except Exception as exc:  # noqa: BLE001 - a probe reports what it got
            out[name] = f"error: {exc}"
    try:
        sums: dict[int, list[float]] = {}
        for smp in nv.nvmlDeviceGetProcessUtilization(h, int((time.time() - 5) * 1e6)):
            sums.setdefault(int(smp.pid), []).append(float(smp.smUtil))
        out["nvmlDeviceGetProcessUtilization_last5s"] = {str(p): v for p, v in sums.items()}
    except Exception as exc:  # noqa: BLE001
        out["nvmlDeviceGetProcessUtilization_last5s"] = f"error: {exc}"
    return out


def phase_mps(cfg_path: str, gpu: int, idx: int, slot: float, agent_pid: int, ref: Reference,
              checks: list[str], tmp: str) -> dict[str, Any] | None:
    ctl = shutil.which("nvidia-cuda-mps-control")
    if ctl is None:
        print("\nPhase M: no nvidia-cuda-mps-control on this machine; MPS not tried")
        return None
    env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(tmp, "mps-pipe"),
           "CUDA_MPS_LOG_DIRECTORY": os.path.join(tmp, "mps-log")}
    for d in env.values():
        os.makedirs(d, exist_ok=True)
    r = subprocess.run([ctl, "-d"], env=dict(os.environ, **env), capture_output=True, text=True, timeout=30)
    print(f"\nPhase M: MPS control daemon started rc={r.returncode} {r.stderr.strip()}")
    if r.returncode != 0:
        return {"started": False, "stderr": r.stderr}
    try:
        probe_box: dict[str, Any] = {}

        def probe_later() -> None:
            time.sleep(20 + slot * 1.5)
            probe_box.update(mps_probe(gpu))

        th = threading.Thread(target=probe_later, daemon=True)
        th.start()
        res = phase_shared(cfg_path, gpu, idx, slot, agent_pid, ref, (9105, 9106), checks, env, label="M")
        th.join(timeout=1)
        print(f"  NVML under MPS: {json.dumps(probe_box)}")
        res["nvml_under_mps"] = probe_box
        return res
    finally:
        subprocess.run([ctl], input="quit\n", env=dict(os.environ, **env), text=True, timeout=30)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child")
    ap.add_argument("--windows", default="[]")
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--slot", type=float, default=10.0)
    ap.add_argument("--alone-seconds", type=float, default=20.0)
    ap.add_argument("--no-mps", action="store_true")
    ap.add_argument("--no-alone", action="store_true")
    ap.add_argument("--interval", type=float, help="the agent's reading interval (default: its own, 5 s): what a "
                    "slower split would cost in accuracy and save in CPU")
    ap.add_argument("--out", default=os.environ.get("OUT", ""))
    a = ap.parse_args()
    if a.child:
        child(a.child, a.gpu, [tuple(w) for w in json.loads(a.windows)])
        return 0
    tmp = tempfile.mkdtemp(prefix="gpushare-")
    cfg_path = write_config(tmp, a.interval)
    agent = start_agent(cfg_path, os.path.join(tmp, "state"), os.path.join(tmp, "agent.log"))
    ref = Reference(a.gpu)
    ref.start()
    checks: list[str] = []
    results: dict[str, Any] = {}
    try:
        idx, _dev = slurm_index_for(os.path.join(tmp, "state"), a.gpu, os.path.join(tmp, "dev"))
        results["shared"] = phase_shared(cfg_path, a.gpu, idx, a.slot, agent.pid, ref, (9101, 9102), checks)
        if not a.no_alone:
            results["alone"] = phase_alone(cfg_path, a.gpu, idx, ref, a.alone_seconds, checks)
        if not a.no_mps:
            results["mps"] = phase_mps(cfg_path, a.gpu, idx, a.slot, agent.pid, ref, checks, tmp)
    finally:
        ref.stop()
        stop_agent(agent)
    import pynvml as nv

    n_gpus = nv.nvmlDeviceGetCount()
    cpu = results["shared"]["agent_cpu_pct"] / n_gpus
    print(f"\nagent CPU over phase S (two jobs sharing GPU {a.gpu}, "
          f"{f'{a.interval:g}-s readings' if a.interval else 'defaults'}): "
          f"{results['shared']['agent_cpu_pct']:.4f} % of one core for {n_gpus} GPU(s) = {cpu:.4f} % per GPU "
          f"(goal <= 0.1 %) over {results['shared']['agent_cpu_window_s']:.0f} s")
    if cpu > 0.1:
        checks.append(f"agent CPU {cpu:.4f} % per GPU > 0.1 %")
    print("\nSUMMARY: " + ("PASS" if not checks else "FAIL:\n  " + "\n  ".join(checks)))
    if a.out:
        os.makedirs(a.out, exist_ok=True)
        with open(os.path.join(a.out, "gpu_share.json"), "w") as fh:
            json.dump({"results": results, "checks": checks}, fh, indent=1, default=str)
        shutil.copy(os.path.join(tmp, "agent.log"), os.path.join(a.out, "gpu_share_agent.log"))
    return 1 if checks else 0


if __name__ == "__main__":
    sys.exit(main())
