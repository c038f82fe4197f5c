"""The GPU mock for the real NvmlSampler's MIG code: a stand-in ``pynvml`` module with one H100 in MIG mode.

Written from the signatures of nvidia-ml-py 13.615 (``nvmlGpmMigSampleGet(device, gpuInstanceId,
sample)`` with the *parent* handle, ``nvmlDeviceGetMigDeviceHandleByIndex(device, index)`` raising
NotFound for empty indexes, ``nvmlDeviceGetMigMode`` -> [current, pending], utilization NotSupported
in MIG mode). It only covers the calls NvmlSampler makes. ``nvmlGpmMetricsGet`` refuses two samples
of different sources, so a sampler that mixed up GPU instances' buffers fails loudly.
"""

from __future__ import annotations

import types
from typing import Any


class NVMLError(Exception):
    pass


class NVMLError_NotFound(NVMLError):  # noqa: N801 - pynvml's names
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


def make(parent_uuid: str, gis: dict[int, dict[str, Any]]) -> types.ModuleType:
    """``gis``: gi id -> {"uuid", "ci", "name", "total", "used", "gpm": {metric id: percent}}; mutable."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError, nv.NVMLError_NotFound = NVMLError, NVMLError_NotFound
    nv.NVMLError_NotSupported = NVMLError_NotSupported
    other = type("NVMLError_Other", (NVMLError,), {})
    nv.NVMLError_LibraryNotFound = nv.NVMLError_DriverNotLoaded = nv.NVMLError_NoPermission = other
    nv.NVML_SUCCESS, nv.NVML_DEVICE_MIG_ENABLE, nv.NVML_GPM_METRICS_GET_VERSION = 0, 1, 1
    nv.NVML_GPU_UTILIZATION_SAMPLES, nv.NVML_VALUE_TYPE_DOUBLE = 1, 0
    for name, mid in (("SM_UTIL", 2), ("SM_OCCUPANCY", 3), ("ANY_TENSOR_UTIL", 5), ("DRAM_BW_UTIL", 10),
                      ("FP64_UTIL", 11), ("FP32_UTIL", 12), ("FP16_UTIL", 13)):
        setattr(nv, f"NVML_GPM_METRIC_{name}", mid)
    nv.nvmlMemory_v2 = 2
    nv.gis = gis
    nv.calls = []
    nv.allocated = set()
    parent = ("gpu", parent_uuid)

    def mig_handle(gi: int) -> tuple[str, int]:
        return ("mig", gi)

    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: parent
    nv.nvmlDeviceGetUUID = lambda h: parent_uuid if h == parent else gis[h[1]]["uuid"]
    nv.nvmlDeviceGetMinorNumber = lambda h: 0
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId=b"00000000:18:00.0")
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3" if h == parent else gis[h[1]]["name"]

    def memory(h: Any, version: Any = None) -> Any:
        if h == parent:
            return types.SimpleNamespace(total=80 << 30, used=sum(g["used"] for g in gis.values()))
        return types.SimpleNamespace(total=gis[h[1]]["total"], used=gis[h[1]]["used"])

    nv.nvmlDeviceGetMemoryInfo = memory
    nv.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=1)

    def not_supported(*_a: Any) -> Any:
        raise NVMLError_NotSupported("Not Supported")

    nv.nvmlDeviceGetSamples = nv.nvmlDeviceGetUtilizationRates = not_supported
    nv.nvmlDeviceGetPowerUsage = lambda h: 250_000
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1_000_000
    nv.nvmlDeviceGetMigMode = lambda h: [1, 1]
    nv.nvmlDeviceGetMaxMigDeviceCount = lambda h: 7

    def mig_by_index(h: Any, i: int) -> Any:
        present = sorted(gis)
        if h != parent or i >= len(present):
            raise NVMLError_NotFound("Not Found")
        return mig_handle(present[i])

    nv.nvmlDeviceGetMigDeviceHandleByIndex = mig_by_index
    nv.nvmlDeviceGetGpuInstanceId = lambda h: h[1]
    nv.nvmlDeviceGetComputeInstanceId = lambda h: gis[h[1]]["ci"]

    def alloc() -> Any:
        smp = types.SimpleNamespace(src=None)
        nv.allocated.add(id(smp))
        return smp

    def free(smp: Any) -> None:
        nv.allocated.discard(id(smp))

    def sample_get(h: Any, smp: Any) -> Any:
        smp.src = ("gpu",)
        return smp

    def mig_sample_get(h: Any, gi: int, smp: Any) -> Any:
        if h != parent:
            raise NVMLError("nvmlGpmMigSampleGet takes the parent GPU's handle")
        if gi not in gis:
            raise NVMLError_NotFound("Not Found")
        nv.calls.append(("mig", gi))
        smp.src = ("mig", gi, gis[gi]["uuid"])
        return smp

    nv.nvmlGpmSampleAlloc, nv.nvmlGpmSampleFree = alloc, free
    nv.nvmlGpmSampleGet, nv.nvmlGpmMigSampleGet = sample_get, mig_sample_get

    class MetricsGet:
        def __init__(self) -> None:
            self.version = self.numMetrics = 0
            self.sample1 = self.sample2 = None
            self.metrics = [types.SimpleNamespace(metricId=0, value=0.0, nvmlReturn=0) for _ in range(210)]

    nv.c_nvmlGpmMetricsGet_t = MetricsGet

    def metrics_get(mg: Any) -> Any:
        if mg.sample1.src != mg.sample2.src:
            raise NVMLError(f"samples of different sources: {mg.sample1.src} vs {mg.sample2.src}")
        src = mg.sample2.src
        for i in range(mg.numMetrics):
            m = mg.metrics[i]
            m.value = float(gis[src[1]]["gpm"].get(m.metricId, 0.0)) if src[0] == "mig" else 50.0
            m.nvmlReturn = 0
        return mg

    nv.nvmlGpmMetricsGet = metrics_get
    return nv
