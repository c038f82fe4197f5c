"""GPU workloads shared by bench/gpu_validate.py and tests/test_gpu_nvml.py (CuPy, imported by the caller).

The one-block spin kernel is the product's reason to exist: ~100 % "GPU utilization" (kernel-active)
with one SM of many busy. Both the H100 validation bench and the gpu-marked test run it, so they must
run the same kernel for the same number of clock cycles.
"""

from __future__ import annotations

from typing import Any

SPIN_SRC = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def clock_khz(cp: Any, gpu: int = 0) -> int:
    """SM clock in kHz (CUDA 13 dropped cudaDeviceProp.clockRate; the attribute still answers)."""
    try:
        return int(cp.cuda.runtime.getDeviceProperties(gpu)["clockRate"])
    except Exception:
        pass
    try:
        return int(cp.cuda.runtime.deviceGetAttribute(13, gpu))  # cudaDevAttrClockRate
    except Exception:
        return 1_980_000  # H100 SXM boost clock
