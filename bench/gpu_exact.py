#!/usr/bin/env python3
"""Exact windows on a real GPU: jobs through the real hooks and the real agent at its default interval,
each compared with NVML/GPM read directly over the same Prolog->Epilog window, in one run.

Jobs (one GPU; each a child process started after the Prolog that imports torch, warms up, works, and is
ended before the Epilog, as a real job's processes are):

* ``short``: bf16 matmuls, a window of 10-15 s;
* ``long``: bf16 matmuls, about 60 s;
* ``restart``: bf16 matmuls for about 45 s, the agent killed with ``kill -9`` 11 s after the Prolog and
  started again 5 s later: the figures cover the measured time, the card says how much;
* ``b2b-a`` then ``b2b-b``: bf16 then fp32 matmuls, back to back with no gap (A's Epilog, then B's Prolog).

The reference (:class:`Reference`) polls the GPU every 0.25 s in a thread of this process: a GPM sample
(kept, so the metrics between any two polls can be computed), the energy counter, and the utilization
sample buffer. For each job the record's window (the agent's reading times) picks the polls nearest its
ends; the GPM reference is the wall-time-weighted mean of the metrics between consecutive polls over the
window (with gaps: over its covered segments). The metric between the window's two end polls alone is
printed too: it weights time by GPU clock cycles, and an idle GPU clocks down, so over a window with idle
parts it reads high (bench/gpm_windows.py shows it). Pass: kernel, SM and tensor within 2 points of the
wall-time reference, energy within 3 %.

Run (repo root, GPU node): ``PYTHONPATH=. python3 bench/gpu_exact.py [--gpu N] [--interval S] [--out DIR]``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import contextlib

from gpu_validate import (  # noqa: E402  (bench/, this script's own directory)
    ROOT,
    end_child,
    ingest_and_seff,
    run_child,
    slurm_env,
    slurm_index_for,
    write_config,
)

POLL_S = 0.25
TOL_PTS, TOL_ENERGY = 2.0, 3.0
GPM_IDS = {"sm_active": 2, "tensor_active": 5, "dfma_active": 6, "hmma_active": 7, "imma_active": 9}


class Reference:
    """Direct NVML/GPM reads of one GPU, every ``POLL_S`` s, stamped with ``time.time()``."""

    def __init__(self, gpu: int) -> None:
        import pynvml as nv

        nv.nvmlInit()
        self.nv = nv
        self.h = nv.nvmlDeviceGetHandleByIndex(gpu)
        self.polls: list[tuple[float, Any, int]] = []  # (epoch, GPM sample, energy mJ)
        self.util: list[tuple[float, float]] = []  # (epoch, utilization.gpu %)
        self.util_ts = 0
        self.ts_offset: float | None = None  # NVML's timeStamp (us) -> epoch s
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._poll()
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(POLL_S):
            try:
                self._poll()
            except self.nv.NVMLError as exc:
                print(f"reference poll failed: {exc}", flush=True)

    def _poll(self) -> None:
        nv = self.nv
        smp = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(self.h, smp)
        t = time.time()
        energy = int(nv.nvmlDeviceGetTotalEnergyConsumption(self.h))
        try:
            vtype, samples = nv.nvmlDeviceGetSamples(self.h, nv.NVML_GPU_UTILIZATION_SAMPLES, self.util_ts)
        except nv.NVMLError_NotFound:
            samples = []
        with self.lock:
            self.polls.append((t, smp, energy))
            for s in samples:
                if s.timeStamp <= self.util_ts:
                    continue
                self.util_ts = max(self.util_ts, int(s.timeStamp))
                if self.ts_offset is None:  # epoch microseconds on Linux drivers; checked, not assumed
                    self.ts_offset = 0.0 if abs(s.timeStamp / 1e6 - t) < 60 else t - s.timeStamp / 1e6
                    print(f"utilization timeStamp {s.timeStamp} vs time.time() {t:.3f}: "
                          f"offset {self.ts_offset:.3f} s", flush=True)
                v = s.sampleValue.dVal if vtype == nv.NVML_VALUE_TYPE_DOUBLE else s.sampleValue.uiVal
                self.util.append((s.timeStamp / 1e6 + self.ts_offset, float(v)))

    def _nearest(self, t: float) -> tuple[float, Any, int]:
        with self.lock:
            return min(self.polls, key=lambda p: abs(p[0] - t))

    def gpm(self, t0: float, t1: float) -> dict[str, float | None]:
        """The metrics between the two polls nearest ``t0`` and ``t1`` (GPU-cycle weighted)."""
        return self._metrics(self._nearest(t0), self._nearest(t1))

    def gpm_wall(self, t0: float, t1: float) -> dict[str, float | None]:
        """The wall-time-weighted mean of the metrics between consecutive polls from ``t0`` to ``t1``."""
        a, b = self._nearest(t0), self._nearest(t1)
        with self.lock:
            polls = [p for p in self.polls if a[0] <= p[0] <= b[0]]
        sums: dict[str, float] = dict.fromkeys(GPM_IDS, 0.0)
        covered: dict[str, float] = dict.fromkeys(GPM_IDS, 0.0)
        for p, q in zip(polls, polls[1:], strict=False):
            vals = self._metrics(p, q)
            for name in GPM_IDS:
                v = vals[name]
                if v is not None:
                    sums[name] += v * (q[0] - p[0])
                    covered[name] += q[0] - p[0]
        return {name: sums[name] / covered[name] if covered[name] > 0 else None for name in GPM_IDS}

    def _metrics(self, a: tuple[float, Any, int], b: tuple[float, Any, int]) -> dict[str, float | None]:
        nv = self.nv
        mg = nv.c_nvmlGpmMetricsGet_t()
        mg.version = nv.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_IDS)
        mg.sample1, mg.sample2 = a[1], b[1]
        for i, mid in enumerate(GPM_IDS.values()):
            mg.metrics[i].metricId = mid
        nv.nvmlGpmMetricsGet(mg)
        out: dict[str, float | None] = {}
        for i, name in enumerate(GPM_IDS):
            v = float(mg.metrics[i].value)
            out[name] = v / 100.0 if mg.metrics[i].nvmlReturn == nv.NVML_SUCCESS and v == v else None
        return out

    def kernel(self, t0: float, t1: float) -> float | None:
        with self.lock:
            vals = [v for t, v in self.util if t0 < t <= t1]
        return sum(vals) / len(vals) / 100.0 if vals else None

    def energy_j(self, t0: float, t1: float) -> float:
        return (self._nearest(t1)[2] - self._nearest(t0)[2]) / 1000.0

    def over(self, segments: list[tuple[float, float]]) -> dict[str, float | None]:
        """Time-weighted means over the covered segments of a window."""
        total = sum(b - a for a, b in segments)
        out: dict[str, float | None] = {}
        parts = [(b - a, self.gpm_wall(a, b), self.kernel(a, b), self.gpm(a, b))
                 for a, b in segments if b - a >= 1.0]
        for name in (*GPM_IDS, "kernel_active", "two_sample_sm", "two_sample_tensor"):
            pick = {"kernel_active": lambda p: p[2], "two_sample_sm": lambda p: p[3]["sm_active"],
                    "two_sample_tensor": lambda p: p[3]["tensor_active"]}.get(name, lambda p, n=name: p[1][n])
            known = [(p[0], v) for p in parts if (v := pick(p)) is not None]
            out[name] = sum(w * v for w, v in known) / sum(w for w, _ in known) if known else None
        out["covered_s"] = total
        return out

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for _t, smp, _e in self.polls:
            with contextlib.suppress(self.nv.NVMLError):
                self.nv.nvmlGpmSampleFree(smp)
        self.polls = []


class Site:
    """The agent process, the hooks, the spool: one GPU node of a fake cluster, real parts only."""

    def __init__(self, gpu: int, interval: float) -> None:
        from slurm_gpueff.config import load

        self.tmp = tempfile.mkdtemp(prefix="gpueff-exact-")
        self.cfg_path = write_config(self.tmp, interval)
        self.cfg = load(self.cfg_path)
        self.gpu = gpu
        self.log = os.path.join(self.tmp, "agent.log")
        self.agent: subprocess.Popen[bytes] | None = None
        self.hook_s: list[tuple[str, float]] = []

    def state(self) -> dict[str, Any]:
        with open(os.path.join(self.cfg.paths.state_dir, "agent", "state.json")) as fh:
            return dict(json.load(fh))

    def start_agent(self) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        with open(self.log, "ab") as logf:
            self.agent = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "agent", "--config",
                                           self.cfg_path], env=env, stdout=logf, stderr=subprocess.STDOUT,
                                          start_new_session=True)
        sock = os.path.join(self.cfg.paths.state_dir, "agent", "reading.sock")
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.agent.poll() is not None:
                raise SystemExit(f"agent exited {self.agent.returncode}: see {self.log}")
            try:
                if self.state().get("pid") == self.agent.pid and os.path.exists(sock):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.1)
        raise SystemExit("agent published no state of its own within 60 s")

    def kill_agent(self) -> None:
        assert self.agent is not None
        self.agent.send_signal(signal.SIGKILL)
        self.agent.wait()

    def stop_agent(self) -> int:
        assert self.agent is not None
        self.agent.send_signal(signal.SIGTERM)
        try:
            return self.agent.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.agent.kill()
            return -9

    def hook(self, kind: str, job_id: int, slurm_idx: int) -> None:
        t0 = time.time()
        r = subprocess.run([sys.executable, os.path.join(ROOT, "hooks", kind)],
                           env=slurm_env(job_id, slurm_idx, self.cfg_path, kind), capture_output=True, text=True,
                           timeout=60)
        self.hook_s.append((kind, time.time() - t0))
        if r.returncode != 0 or r.stderr.strip():
            print(f"  {kind} rc={r.returncode} stderr: {r.stderr.strip()}", flush=True)

    def record(self, job_id: int) -> dict[str, Any]:
        from slurm_gpueff import spool

        with open(os.path.join(self.cfg.paths.spool_dir, spool.INCOMING, spool.record_name(job_id, "gpuval"))) as fh:
            return dict(json.load(fh))


def run_job(site: Site, job_id: int, slurm_idx: int, workload: str, seconds: float,
            during: Any = None, prolog: bool = True) -> None:
    """Prolog, the job's process (started after it, ended before the Epilog), Epilog."""
    if prolog:
        site.hook("prolog", job_id, slurm_idx)
    t0 = time.time()
    proc = run_child(workload, site.gpu)
    try:
        while time.time() - t0 < seconds:
            if during is not None:
                during(time.time() - t0)
            time.sleep(0.1)
    finally:
        end_child(proc)
    site.hook("epilog", job_id, slurm_idx)


def compare(name: str, rec: dict[str, Any], ref: Reference) -> dict[str, Any]:
    g = rec["gpus"][0]
    w = g.get("window") or {}
    t0, t1 = w.get("start"), w.get("end")
    if t0 is None or t1 is None:
        return {"job": name, "failures": [f"{name}: no window in the record ({g.get('missing')})"], "gpu": g}
    segs, at = [], t0
    for a, b, _why in sorted(w.get("gaps") or []):
        if a > at:
            segs.append((at, a))
        at = max(at, b)
    if t1 > at:
        segs.append((at, t1))
    r = ref.over(segs)
    energy_ref = ref.energy_j(t0, t1)
    rows, bad = [], []
    for m in ("kernel_active", "sm_active", "tensor_active", "hmma_active", "dfma_active", "imma_active"):
        got, want = g.get(m), r.get(m)
        diff = None if got is None or want is None else 100 * (got - want)
        ok = diff is not None and abs(diff) <= TOL_PTS
        judged = m in ("kernel_active", "sm_active", "tensor_active")
        rows.append((m, got, want, diff, "PASS" if ok else ("FAIL" if judged else "-")))
        if judged and not ok:
            bad.append(f"{name}: {m} {got} vs reference {want}")
    e = g.get("energy_j")
    e_diff = None if e is None or not energy_ref else 100 * (e - energy_ref) / energy_ref
    e_ok = e_diff is not None and abs(e_diff) <= TOL_ENERGY
    if not e_ok:
        bad.append(f"{name}: energy {e} J vs reference {energy_ref:.1f} J")
    print(f"\n{name}: window {g.get('window_s')} s, measured {g.get('measured_s')} s, gaps {w.get('gaps')}, "
          f"start exact {w.get('start_exact')} (offset {w.get('start_offset_s')} s), end exact "
          f"{w.get('end_exact')} (offset {w.get('end_offset_s')} s), break {w.get('break')}, "
          f"reference polls at the ends {r.get('covered_s'):.1f} s covered")
    print(f"  {'figure':14} {'measured':>9} {'reference':>9} {'diff':>8}")
    for m, got, want, diff, verdict in rows:
        fmt = (lambda v: "n/a" if v is None else f"{100 * v:.2f}%")  # noqa: E731
        print(f"  {m:14} {fmt(got):>9} {fmt(want):>9} {'n/a' if diff is None else f'{diff:+.2f} pt':>8}  {verdict}")
    two = (lambda v: "n/a" if v is None else f"{100 * v:.2f}%")  # noqa: E731
    print(f"  (GPM between the window's two end polls alone, GPU-cycle weighted: SM {two(r.get('two_sample_sm'))}"
          f", tensor {two(r.get('two_sample_tensor'))})")
    print(f"  {'energy_j':14} {e if e is not None else 'n/a':>9} {energy_ref:>9.1f} "
          f"{'n/a' if e_diff is None else f'{e_diff:+.2f} %':>8}  {'PASS' if e_ok else 'FAIL'}")
    return {"job": name, "window": w, "window_s": g.get("window_s"), "measured_s": g.get("measured_s"),
            "rows": rows, "two_sample": [r.get("two_sample_sm"), r.get("two_sample_tensor")],
            "energy": [e, energy_ref, e_diff], "failures": bad, "gpu": g}


def main(gpu: int = 0, interval: float = 5.0, out: str = "") -> int:
    site = Site(gpu, interval)
    ref = Reference(gpu)
    ref.start()
    site.start_agent()
    slurm_idx, dev_dir = slurm_index_for(site.cfg.paths.state_dir, gpu, os.path.join(site.tmp, "dev"))
    print(f"agent interval {interval:g} s (tick_wait_s {site.cfg.collector.tick_wait_s:g}); Slurm index "
          f"{slurm_idx} (minor map from {dev_dir})", flush=True)
    jobs = {"short": 910001, "long": 910002, "restart": 910003, "b2b-a": 910004, "b2b-b": 910005}
    results: list[dict[str, Any]] = []
    try:
        run_job(site, jobs["short"], slurm_idx, "bf16", 11.0)
        run_job(site, jobs["long"], slurm_idx, "bf16", 55.0)
        events: list[str] = []

        def chaos(elapsed: float) -> None:
            if elapsed >= 11.0 and "killed" not in events:
                site.kill_agent()
                events.append("killed")
                print(f"  agent killed (kill -9) at {time.strftime('%H:%M:%S')}", flush=True)
            elif elapsed >= 16.0 and "killed" in events and "started" not in events:
                site.start_agent()
                events.append("started")
                print(f"  agent started again at {time.strftime('%H:%M:%S')}", flush=True)

        run_job(site, jobs["restart"], slurm_idx, "bf16", 45.0, during=chaos)
        run_job(site, jobs["b2b-a"], slurm_idx, "bf16", 10.0)
        run_job(site, jobs["b2b-b"], slurm_idx, "fp32", 10.0)
    finally:
        rc = site.stop_agent()
        time.sleep(0.5)
    for name, jid in jobs.items():
        results.append(compare(name, site.record(jid), ref))
    a, b = results[3]["window"], results[4]["window"]
    bad = [f for r in results for f in r["failures"]]
    overlap_ok = bool(a and b and b.get("start", 0) >= a.get("end", 1e18))
    print(f"\nback to back: A ends {a.get('end')}, B starts {b.get('start')}: "
          f"{'no shared interval PASS' if overlap_ok else 'FAIL'}")
    if not overlap_ok:
        bad.append("back to back windows overlap")
    cards = ingest_and_seff(site.cfg_path, jobs, out)
    text = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", str(jobs["restart"])],
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
                                   GPUEFF_CONFIG=site.cfg_path),
                          capture_output=True, text=True).stdout
    flat = " ".join(text.split())
    cov_ok = "measured" in flat and "agent down" in flat
    print(f"restart card shows the coverage: {'PASS' if cov_ok else 'FAIL'}")
    if not cov_ok:
        bad.append("the restart job's card does not show its coverage")
    hooks = [s for _k, s in site.hook_s]
    print(f"hook wall times: min {min(hooks):.2f} s, max {max(hooks):.2f} s, n {len(hooks)}")
    print("\nsummary (measured - reference; points, energy %):")
    print(f"  {'job':8} {'window_s':>8} {'measured':>8} {'kernel':>7} {'SM':>7} {'tensor':>7} {'energy':>7}")
    for r in results:
        d = {m: diff for m, _g, _w, diff, _v in r.get("rows", [])}
        f = (lambda v: "n/a" if v is None else f"{v:+.2f}")  # noqa: E731
        print(f"  {r['job']:8} {r.get('window_s') or 0:>8.1f} {r.get('measured_s') or 0:>8.1f} "
              f"{f(d.get('kernel_active')):>7} {f(d.get('sm_active')):>7} {f(d.get('tensor_active')):>7} "
              f"{f((r.get('energy') or [None] * 3)[2]):>7}")
    ref.close()
    if out:
        with open(os.path.join(out, "gpu_exact.json"), "w") as fh:
            json.dump({"interval_s": interval, "results": results, "failures": bad, "agent_exit": rc,
                       "hook_s": site.hook_s, "cards": cards}, fh, indent=1, default=str)
    for b_ in bad:
        print(f"FAIL {b_}")
    print(f"\n{len(bad)} check(s) failed" if bad else "\nall checks passed")
    return 1 if bad or rc != 0 else 0


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to load (default 0)")
    ap.add_argument("--interval", type=float, default=5.0, help="agent.interval_s (default 5, the product's)")
    ap.add_argument("--out", default=os.environ.get("OUT", ""), help="directory for JSON results (default $OUT)")
    a = ap.parse_args()
    sys.exit(main(a.gpu, a.interval, a.out))
