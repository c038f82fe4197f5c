#!/usr/bin/env python3
"""How GPM's two-sample means relate to host time: poll GPM every 0.2 s around a job-like workload (idle,
then bf16 matmuls started at a known host time, then idle), and compare, for windows of various lengths
and edges, the metric between the window's two end samples with the host-time-weighted mean of the
consecutive-pair metrics inside it. Prints where SM activity starts and stops against the host clock.

Run (repo root, GPU node): ``PYTHONPATH=. python3 bench/gpm_windows.py``
"""

from __future__ import annotations

import subprocess
import sys
import time

import pynvml as nv

STEP = 0.2


def metric(a: object, b: object, mid: int = 2) -> float | None:
    mg = nv.c_nvmlGpmMetricsGet_t()
    mg.version = nv.NVML_GPM_METRICS_GET_VERSION
    mg.numMetrics = 1
    mg.sample1, mg.sample2 = a, b
    mg.metrics[0].metricId = mid
    nv.nvmlGpmMetricsGet(mg)
    v = float(mg.metrics[0].value)
    return v if mg.metrics[0].nvmlReturn == nv.NVML_SUCCESS and v == v else None


def main() -> int:
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    polls: list[tuple[float, object]] = []

    def poll() -> None:
        s = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(h, s)
        polls.append((time.time(), s))

    t_start = time.time()
    while time.time() - t_start < 3:
        poll()
        time.sleep(STEP)
    child = subprocess.Popen([sys.executable, "bench/gpu_validate.py", "--child", "bf16"], stdout=subprocess.PIPE,
                             text=True)
    t_launch = time.time()
    ready = None
    while child.poll() is None and time.time() - t_launch < 40:
        poll()
        time.sleep(STEP)
        if ready is None and time.time() - t_launch > 0:
            pass
        if time.time() - t_launch > 14:
            break
    child.terminate()
    child.wait()
    t_end = time.time()
    while time.time() - t_end < 3:
        poll()
        time.sleep(STEP)
    print(f"launch at +{t_launch - t_start:.2f} s, terminated at +{t_end - t_start:.2f} s")
    pair = [(polls[i][0], polls[i + 1][0], metric(polls[i][1], polls[i + 1][1])) for i in range(len(polls) - 1)]
    first_busy = next((a for a, b, v in pair if v and v > 5), None)
    last_busy = max((b for a, b, v in pair if v and v > 5), default=None)
    print(f"pairs > 5% SM from +{(first_busy or 0) - t_start:.2f} s to +{(last_busy or 0) - t_start:.2f} s")
    for a, b, v in pair[::5]:
        print(f"  +{a - t_start:6.2f} .. +{b - t_start:6.2f}  SM {v}")
    print("window (start, end rel. s): two-sample SM vs chained host-weighted SM")
    n = len(polls)
    for i0, i1 in [(0, n - 1), (5, n - 1), (10, n - 10), (15, n - 15), (20, 60), (n // 3, n - 5), (0, n // 2)]:
        i1 = min(i1, n - 1)
        two = metric(polls[i0][1], polls[i1][1])
        ch = [(b - a, v) for a, b, v in pair[i0:i1] if v is not None]
        chained = sum(w * v for w, v in ch) / sum(w for w, _ in ch)
        print(f"  +{polls[i0][0] - t_start:6.2f} .. +{polls[i1][0] - t_start:6.2f}: two-sample {two:.2f}  "
              f"chained {chained:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
