#!/usr/bin/env python3
"""Two GPUs of one host, and a running job's live card, through the real hooks and the real agent at its
default interval (5 s), each job compared with NVML/GPM read directly on its own GPU, in one run.

* ``live``: a bf16 job on GPU A; the agent writes live records every 20 s; the live card (ingested while
  the job runs, read with seff-gpu --json) against the job's final card: within 2 points.
* ``one-of-two``: a job holding both GPUs that loads only GPU A: "1 of 2 GPUs never used".
* ``pair-a`` / ``pair-b``: two 1-GPU jobs at once, fp32 on GPU A and bf16 on GPU B: each record's GPU is
  its own (UUID, and figures against that GPU's reference; fp32 has no tensor work, bf16 has).
* ``remap``: Slurm's order differing from NVML's: a hook configuration whose device directory lists only
  GPU B's /dev/nvidiaN (``[collector] dev_dir``), so Slurm index 0 is GPU B, while GPU A runs other work.
* ``allreduce``: NCCL all-reduce across both GPUs (one process a GPU): what the card says.
* agent CPU: one in-process agent on the real NVML sampler, ticking every second with 2 GPUs, then with 1.

The jobs are short (20-66 s), so ``[analysis] short_job_s`` is 20 s here (default 60 s) for the cards to
carry verdicts. NVLink multicast stays off (NCCL_NVLS_ENABLE=0 and the rest, as the device notes ask).
CUDA's device order
is PCI bus order here, as NVML's is, so the workloads load the GPU the reference reads.

Run (repo root, a node with 2 GPUs): ``PYTHONPATH=. python3 bench/gpu_multi.py``; ``$OUT`` gets the JSON.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

os.environ.update(NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
                  CUDA_DEVICE_ORDER="PCI_BUS_ID")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gpu_exact import Reference, Site, compare  # noqa: E402
from gpu_validate import ROOT, end_child, run_child, slurm_index_for  # noqa: E402

TOL = 2.0
LIVE_EVERY_S = 20


def allreduce_rank(rank: int, port: int) -> None:
    """One rank of a 2-GPU NCCL all-reduce loop (256 MiB of fp32), until SIGTERM."""
    stop = False

    def _stop(*_: Any) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    import torch
    import torch.distributed as dist

    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    x = torch.ones(64 << 20, device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()
    print("READY", flush=True)
    while not stop:
        for _ in range(10):
            dist.all_reduce(x)
        torch.cuda.synchronize()
    dist.destroy_process_group()


def run_allreduce() -> list[subprocess.Popen[str]]:
    port = 29500 + os.getpid() % 1000
    log = open(os.path.join(os.environ.get("TMPDIR", "/tmp"), "allreduce.log"), "w")  # noqa: SIM115
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=log, text=True) for r in (0, 1)]
    for p in procs:
        line = p.stdout.readline() if p.stdout else ""
        if "READY" not in line:
            for q in procs:
                q.kill()
            raise RuntimeError("all-reduce ranks did not start")
    return procs


def env_for(job_id: int, idxs: list[int], cfg_path: str, kind: str) -> dict[str, str]:
    gpus = ",".join(map(str, idxs))
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_GPUS": gpus, "CUDA_VISIBLE_DEVICES": gpus,
           "SLURMD_NODENAME": "gpuval", "SLURM_CLUSTER_NAME": "gpuval", "SLURM_JOB_USER": "root",
           "SLURM_JOB_UID": "0", "SLURM_JOB_ACCOUNT": "bench", "SLURM_JOB_PARTITION": "gpu",
           "GPUEFF_CONFIG": cfg_path}
    if kind == "epilog":
        env.update({"SLURM_JOB_EXIT_CODE2": "0:0", "SLURM_JOB_EXIT_CODE": "0"})
    return env


def hook(site: Site, kind: str, job_id: int, idxs: list[int], cfg_path: str | None = None) -> None:
    t0 = time.time()
    r = subprocess.run([sys.executable, os.path.join(ROOT, "hooks", kind)],
                       env=env_for(job_id, idxs, cfg_path or site.cfg_path, kind), capture_output=True, text=True,
                       timeout=60)
    site.hook_s.append((kind, time.time() - t0))
    if r.returncode != 0 or r.stderr.strip():
        print(f"  {kind} {job_id} rc={r.returncode} stderr: {r.stderr.strip()}", flush=True)


def cli(site: Site, *args: str, seff: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
               GPUEFF_CONFIG=site.cfg_path)
    mod = "slurm_gpueff.cli.seff" if seff else "slurm_gpueff.cli.gpueff"
    return subprocess.run([sys.executable, "-m", mod, *args], env=env, capture_output=True, text=True, timeout=120)


def card_json(site: Site, job_id: int) -> dict[str, Any]:
    p = cli(site, "--json", str(job_id), seff=True)
    try:
        return dict(json.loads(p.stdout)["jobs"][0])
    except (ValueError, KeyError, IndexError):
        return {"error": p.stdout + p.stderr}


def check_gpus(name: str, rec: dict[str, Any], refs: dict[str, Reference]) -> list[dict[str, Any]]:
    """Each GPU of the record against the reference of the GPU its UUID names."""
    out = []
    for g in rec["gpus"]:
        ref = refs.get(g.get("uuid") or "")
        if ref is None:
            out.append({"job": f"{name}/gpu{g['index']}", "failures": [f"{name}: GPU {g['index']} has no UUID"]})
            continue
        out.append(compare(f"{name}/slurm{g['index']}", {**rec, "gpus": [g]}, ref))
    return out


def agent_cpu(base: str, ticks: int = 8) -> dict[str, float]:
    """CPU seconds per tick of an in-process agent on the real sampler, 2 GPUs then 1, twice each."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.node.agent import Agent
    from slurm_gpueff.node.nvml_sampler import NvmlSampler

    class OneGpu(NvmlSampler):
        def open(self) -> Any:
            infos = super().open()
            self._devs = self._devs[:1]
            return infos[:1]

    tmp = os.path.join(base, "cpu-agent")
    cfg = Config({"paths": {"state_dir": tmp, "spool_dir": tmp + "/spool"}})
    per: dict[str, list[float]] = {"2": [], "1": []}
    for n in ("2", "1", "2", "1"):
        agent = Agent(cfg, NvmlSampler() if n == "2" else OneGpu())
        agent.open()
        agent.tick()
        c0 = time.process_time()
        for _ in range(ticks):
            time.sleep(1.0)
            agent.tick()
        per[n].append((time.process_time() - c0) / ticks)
        agent.close()
    two, one = sum(per["2"]) / 2, sum(per["1"]) / 2
    return {"tick_cpu_s_2gpu": two, "tick_cpu_s_1gpu": one, "per_gpu_2": two / 2, "per_gpu_1": one,
            "ratio_2_to_1": two / one if one else float("nan")}


def main(out: str = "") -> int:
    site = Site(0, 5.0)
    with open(site.cfg_path, "a") as fh:  # [agent] is the file's last table
        # and verdicts for jobs of 20 s and more: the default (60 s) would leave these short jobs unjudged
        fh.write(f"live_interval_s = {LIVE_EVERY_S}\n[analysis]\nshort_job_s = 20.0\n")
    from slurm_gpueff.config import load

    site.cfg = load(site.cfg_path)
    site.start_agent()
    state = site.state()
    by_index = {g["index"]: u for u, g in state["gpus"].items()}
    if len(by_index) < 2:
        raise SystemExit(f"this host has {len(by_index)} GPU(s); 2 are needed")
    ua, ub = by_index[0], by_index[1]
    refs = {ua: Reference(0), ub: Reference(1)}
    for r in refs.values():
        r.start()
    ia, dev = slurm_index_for(site.cfg.paths.state_dir, 0, os.path.join(site.tmp, "dev"))
    ib, _ = slurm_index_for(site.cfg.paths.state_dir, 1, os.path.join(site.tmp, "dev"))
    print(f"GPUs: NVML 0 = {ua} minor {state['gpus'][ua]['minor']} bus {state['gpus'][ua]['pci_bus_id']} -> Slurm "
          f"index {ia}; NVML 1 = {ub} minor {state['gpus'][ub]['minor']} bus {state['gpus'][ub]['pci_bus_id']} -> "
          f"Slurm index {ib} (devices from {dev})", flush=True)
    # Slurm's order made to differ from NVML's: a device dir with only GPU B's node
    remap_dev = os.path.join(site.tmp, "dev-remap")
    os.makedirs(remap_dev, exist_ok=True)
    open(os.path.join(remap_dev, f"nvidia{state['gpus'][ub]['minor']}"), "w").close()
    remap_cfg = os.path.join(site.tmp, "remap.toml")
    with open(site.cfg_path) as fh, open(remap_cfg, "w") as out_fh:
        out_fh.write(fh.read().replace("[collector]\n", f'[collector]\ndev_dir = "{remap_dev}"\n'))
    jobs = {"live": 920001, "one-of-two": 920002, "pair-a": 920003, "pair-b": 920004, "remap": 920005,
            "allreduce": 920006}
    live: dict[str, Any] = {}
    try:
        # live: a steady bf16 job; the card while it runs against its final card
        proc = run_child("bf16", 0)
        hook(site, "prolog", jobs["live"], [ia])
        t0 = time.time()
        time.sleep(2 * LIVE_EVERY_S + 8)
        cli(site, "ingest")
        live["card"] = card_json(site, jobs["live"])
        live["text"] = cli(site, str(jobs["live"]), seff=True).stdout
        print("\n$ seff-gpu (running)\n" + live["text"], flush=True)
        while time.time() - t0 < 3 * LIVE_EVERY_S + 5:
            time.sleep(0.2)
        hook(site, "epilog", jobs["live"], [ia])
        end_child(proc)
        # one of two GPUs used
        proc = run_child("bf16", 0)
        hook(site, "prolog", jobs["one-of-two"], sorted([ia, ib]))
        time.sleep(25)
        hook(site, "epilog", jobs["one-of-two"], sorted([ia, ib]))
        end_child(proc)
        # two jobs at once, one per GPU, different work
        pa, pb = run_child("fp32", 0), run_child("bf16", 1)
        hook(site, "prolog", jobs["pair-a"], [ia])
        hook(site, "prolog", jobs["pair-b"], [ib])
        time.sleep(25)
        hook(site, "epilog", jobs["pair-b"], [ib])
        hook(site, "epilog", jobs["pair-a"], [ia])
        # the remap job: Slurm index 0 is GPU B under remap.toml; GPU A keeps its fp32 work meanwhile
        hook(site, "prolog", jobs["remap"], [0], remap_cfg)
        time.sleep(20)
        hook(site, "epilog", jobs["remap"], [0], remap_cfg)
        end_child(pa)
        end_child(pb)
        # NCCL all-reduce across both
        ranks = run_allreduce()
        hook(site, "prolog", jobs["allreduce"], sorted([ia, ib]))
        time.sleep(30)
        hook(site, "epilog", jobs["allreduce"], sorted([ia, ib]))
        for p in ranks:  # both at once: a rank left alone waits on its peer forever
            p.send_signal(signal.SIGTERM)
        for p in ranks:
            end_child(p)
    finally:
        rc = site.stop_agent()
        for r in refs.values():
            r.stop.set()
            r.thread.join(5)
    recs = {name: site.record(jid) for name, jid in jobs.items()}  # before ingest takes them from the spool
    cli(site, "ingest")
    results: dict[str, Any] = {}
    bad: list[str] = []
    for name, jid in jobs.items():
        rec = recs[name]
        rows = check_gpus(name, rec, refs)
        results[name] = {"record_gpus": [{k: g.get(k) for k in ("index", "uuid", "kernel_active", "sm_active",
                                                                  "tensor_active", "energy_j", "window_s")}
                                         for g in rec["gpus"]], "checks": rows}
        text = cli(site, str(jid), seff=True).stdout
        results[name]["card"] = text
        print(f"\n$ seff-gpu {jid}   # {name}\n{text}", flush=True)
        bad += [f for r in rows for f in r.get("failures", [])]
    # attribution: each job's GPUs are the ones it was given
    want = {"live": [ua], "one-of-two": sorted([ua, ub]), "pair-a": [ua], "pair-b": [ub], "remap": [ub],
            "allreduce": sorted([ua, ub])}
    for name, uuids in want.items():
        got = sorted(g["uuid"] for g in results[name]["record_gpus"])
        if got != sorted(uuids):
            bad.append(f"{name}: GPUs {got}, expected {sorted(uuids)}")
    if "1 of 2 GPUs never used" not in " ".join(results["one-of-two"]["card"].split()):
        bad.append("one-of-two: the card does not say '1 of 2 GPUs never used'")
    # the agent's CPU in a process of its own (it opens and shuts NVML down: never beside the references)
    p = subprocess.run([sys.executable, __file__, "--agent-cpu", site.tmp], capture_output=True, text=True,
                       timeout=180)
    try:
        cpu = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        cpu = {"error": p.stdout[-2000:] + p.stderr[-2000:]}
        bad.append("agent CPU: the measurement failed")
    # live against final
    final = card_json(site, jobs["live"])
    rows = []
    for m in ("kernel_active", "sm_active", "tensor_active"):
        a = ((live.get("card", {}).get("figures") or {}).get(m) or {}).get("value")
        b = ((final.get("figures") or {}).get(m) or {}).get("value")
        d = None if a is None or b is None else 100 * (a - b)
        ok = d is not None and abs(d) <= TOL
        rows.append((m, a, b, d, ok))
        if not ok:
            bad.append(f"live: {m} live {a} vs final {b}")
    running = (live.get("card", {}).get("job") or {}).get("running")
    if running is not True:
        bad.append(f"live: the card read while the job ran is not marked running ({running!r})")
    print(f"\nlive card (as of {(live.get('card', {}).get('job') or {}).get('as_of')}) against the final card:")
    for m, a, b, d, ok in rows:
        f = (lambda v: "n/a" if v is None else f"{100 * v:.2f}%")  # noqa: E731
        print(f"  {m:14} live {f(a):>8} final {f(b):>8} {'n/a' if d is None else f'{d:+.2f} pt':>9} "
              f"{'PASS' if ok else 'FAIL'}")
    if "error" not in cpu:
        print(f"\nagent CPU per tick: 2 GPUs {1000 * cpu['tick_cpu_s_2gpu']:.2f} ms ({1000 * cpu['per_gpu_2']:.2f} ms "
              f"a GPU), 1 GPU {1000 * cpu['tick_cpu_s_1gpu']:.2f} ms; 2-GPU / 1-GPU tick = {cpu['ratio_2_to_1']:.2f}")
    print("\nsummary (measured - reference on the job's own GPU; points, energy %):")
    for name in jobs:
        for r in results[name]["checks"]:
            d = {m: diff for m, _g, _w, diff, _v in r.get("rows", [])}
            f = (lambda v: "n/a" if v is None else f"{v:+.2f}")  # noqa: E731
            print(f"  {r['job']:22} kernel {f(d.get('kernel_active')):>7} SM {f(d.get('sm_active')):>7} tensor "
                  f"{f(d.get('tensor_active')):>7} energy {f((r.get('energy') or [None] * 3)[2]):>7}")
    hooks = [s for _k, s in site.hook_s]
    print(f"hook wall times: min {min(hooks):.2f} s, max {max(hooks):.2f} s, n {len(hooks)}; agent exit {rc}")
    if out:
        with open(os.path.join(out, "gpu_multi.json"), "w") as fh:
            json.dump({"results": results, "live": {"card": live.get("card"), "final": final, "rows": rows},
                       "agent_cpu": cpu, "failures": bad, "hook_s": site.hook_s}, fh, indent=1, default=str)
    for b in bad:
        print(f"FAIL {b}")
    print(f"\n{len(bad)} check(s) failed" if bad else "\nall checks passed")
    return 1 if bad or rc != 0 else 0


if __name__ == "__main__":
    if "--agent-cpu" in sys.argv:
        print(json.dumps(agent_cpu(sys.argv[sys.argv.index("--agent-cpu") + 1])))
        sys.exit(0)
    if "--rank" in sys.argv:
        allreduce_rank(int(sys.argv[sys.argv.index("--rank") + 1]), int(sys.argv[sys.argv.index("--port") + 1]))
        sys.exit(0)
    sys.exit(main(out=os.environ.get("OUT", "")))
