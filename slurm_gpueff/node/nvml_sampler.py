"""Read every GPU of the node through NVML (and GPM on Hopper and newer): the node agent's only GPU access.

The agent sees GPUs only through :class:`Sampler`, so tests drive it with a fake (the GPU mock). Sources
per figure: docs/FIGURES.md. utilization.gpu is a ring buffer, so a tick averages every reading since the
previous one; GPM gives exact means between two GPM samples (NaN or a per-metric error is ``None``). MIG
devices are enumerated every tick (GPU instances can be re-created without a GPU reset); GPM is sampled
per GPU instance; NVML has no per-slice utilization.gpu, power or energy. pynvml is imported lazily.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import CollectorError
from .gpu_ids import profile_from_name

log = logging.getLogger(__name__)

# record.py metric name -> pynvml GPM metric constant name (percent 0-100 each).
GPM_METRICS: dict[str, str] = {
    "sm_active": "NVML_GPM_METRIC_SM_UTIL",
    "sm_occupancy": "NVML_GPM_METRIC_SM_OCCUPANCY",
    "tensor_active": "NVML_GPM_METRIC_ANY_TENSOR_UTIL",
    "dram_active": "NVML_GPM_METRIC_DRAM_BW_UTIL",
    "fp64_active": "NVML_GPM_METRIC_FP64_UTIL",
    "fp32_active": "NVML_GPM_METRIC_FP32_UTIL",
    "fp16_active": "NVML_GPM_METRIC_FP16_UTIL",
    # tensor activity by precision (they add up to ANY_TENSOR): FP16/BF16/TF32, integer, FP64
    "hmma_active": "NVML_GPM_METRIC_HMMA_TENSOR_UTIL",
    "imma_active": "NVML_GPM_METRIC_IMMA_TENSOR_UTIL",
    "dfma_active": "NVML_GPM_METRIC_DFMA_TENSOR_UTIL",
}
# Kernel activity on a GPM GPU: GRAPHICS_UTIL, the share of time any kernel ran, exact over the same GPM sample
# pair as the figures above (it tracks utilization.gpu: docs/gpu-validation). It spares the utilization
# ring buffer, the costliest NVML call of a reading; GPUs without GPM keep the ring buffer.
GPM_KERNEL = ("kernel_active", "NVML_GPM_METRIC_GRAPHICS_UTIL")
NO_GPM_REASON = "GPU has no GPM metrics (pre-Hopper); kernel activity only"
# GPM samples closer than about this give zeros and NaN (docs/gpu-validation): the agent spaces the readings
# it takes on request at least GPM_MIN_S from the previous one. A reading closer than GPM_SKIP_S to the
# previous GPM sample (only the first tick after start-up, right after the priming sample) takes none, and
# the next one covers both intervals.
GPM_MIN_S = 1.0
GPM_SKIP_S = 0.5
# A GPM mean between two samples weights time by GPU clock cycles, and an idle GPU clocks down: an interval
# half idle, half busy reads well above half busy (docs/gpu-validation). The agent therefore takes a GPM
# sample every GPM_STEP_S between its full readings, so that the few intervals spanning a job's idle/busy
# edges are short; its time integral weights each interval by wall time.
GPM_STEP_S = 1.0
# Taking a GPM sample is cheap; turning two into figures (nvmlGpmMetricsGet) costs about 1.5 ms of CPU a call
# whatever the number of metrics (docs/gpu-validation). So the 1-s steps only take samples, and a reading that
# asks for figures turns them into figures: one call per run of steps over which the SM clock stayed within
# GPM_STEADY_CLOCK of itself (cycle weighting is then time weighting), and one per step across a clock change.
# At most GPM_MAX_STEPS samples wait; more (a long interval) are turned into figures early.
GPM_STEADY_CLOCK = 1.10
GPM_MAX_STEPS = 32
GPM_POOL = 8  # free sample buffers kept per GPU


@dataclass
class GpuInfo:
    """Identity of one GPU, fixed for the agent's life."""

    uuid: str
    index: int  # NVML index (PCI bus order), not Slurm's index
    minor: int | None  # N of /dev/nvidiaN: what Slurm's GRES File maps to
    pci_bus_id: str | None
    model: str | None
    memory_total_bytes: int | None
    gpm_supported: bool
    gpm_reason: str | None = None  # why GPM figures are missing, when they are
    mig_enabled: bool = False  # MIG mode on: jobs get slices; see GpuSample.mig


@dataclass
class MigInfo:
    """One MIG device (a compute instance inside a GPU instance) of a GPU in MIG mode."""

    uuid: str  # the MIG device UUID, what CUDA_VISIBLE_DEVICES holds
    parent_uuid: str
    gi_id: int
    ci_id: int | None
    profile: str | None  # e.g. 1g.10gb (from the MIG device's name)
    memory_total_bytes: int | None  # the GPU instance's memory


@dataclass
class MigSample:
    """One reading of one GPU instance (GPM and memory are per GPU instance, shared by its compute instances)."""

    gi_id: int
    memory_used_bytes: int | None = None
    gpm: dict[str, float | None] | None = None  # as GpuSample.gpm; None on the GI's first sample or without GPM
    gpm_dt: float | None = None
    gpm_reason: str | None = None  # why there is no GPM for this GPU instance at all
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class GpuSample:
    """One reading of one GPU. ``t`` is a monotonic clock in seconds (only differences matter)."""

    uuid: str
    t: float
    kernel_pct: float | None = None
    memory_used_bytes: int | None = None
    power_mw: float | None = None
    energy_mj: int | None = None
    # GPM percentages averaged over the ``gpm_dt`` seconds since the previous GPM sample; None when
    # there is no previous sample yet (first tick) or the GPU has no GPM.
    gpm: dict[str, float | None] | None = None
    gpm_dt: float | None = None
    # The GPU's GPM figures since its previous reading as (means, seconds) steps, oldest first; ``gpm`` and
    # ``gpm_dt`` are then the newest step's. None where a sample carries one mean only (``gpm``).
    gpm_steps: list[tuple[dict[str, float | None], float]] | None = None
    errors: dict[str, str] = field(default_factory=dict)
    # MIG mode only (None otherwise): the MIG devices that exist at this tick, and per GPU instance id
    # its reading. A GPU instance missing here was destroyed since the previous tick.
    mig_devices: list[MigInfo] | None = None
    mig: dict[int, MigSample] | None = None


@dataclass
class ProcSample:
    """One GPU's processes since the previous look: NVML's per-process SM-utilization samples summed per pid
    (percent x samples), each compute process's used memory, and why a part could not be read."""

    uuid: str
    sm: dict[int, float] = field(default_factory=dict)
    memory: dict[int, int | None] = field(default_factory=dict)
    error: str | None = None


class Sampler(Protocol):
    """What the agent needs from the GPU side. Tests implement it with a fake (the GPU mock)."""

    def open(self) -> list[GpuInfo]:
        """Initialise; return the node's GPUs. Raise CollectorError with a clear sentence if impossible."""

    def sample(self, read_energy: bool, gpm_for: set[str] | None = None) -> list[GpuSample]:
        """Read every GPU once; ``energy_mj`` only when ``read_energy`` (it is the expensive call). GPM figures
        for the GPUs in ``gpm_for`` only (None: all); the others' GPM samples wait for a later reading."""

    def sample_gpm(self) -> list[GpuSample]:
        """GPM only (``t``, ``gpm``, ``gpm_dt``) of every GPU that has it, between full readings."""

    def sample_processes(self, uuids: set[str], since: float, busy: set[str] | None = None) -> dict[str, ProcSample]:
        """The compute processes of these GPUs, and for those in ``busy`` (None: all) their utilization samples
        taken after ``since`` (the previous reading's wall time) and after the previous call."""

    def close(self) -> None:
        ...


_NVML_ADVICE = {
    "NVMLError_LibraryNotFound": "NVML library libnvidia-ml.so.1 not found: no NVIDIA driver on this node",
    "NVMLError_DriverNotLoaded": "NVIDIA kernel driver is not loaded on this node",
    "NVMLError_NoPermission": "no permission to use NVML (run the agent as root)",
}


def explain_nvml_error(pynvml: Any, exc: Exception) -> str:
    """One sentence for an NVML initialisation failure (the common ones get advice)."""
    for cls, advice in _NVML_ADVICE.items():
        if isinstance(exc, getattr(pynvml, cls, ())):
            return f"{advice} (pynvml: {type(exc).__name__})"
    return f"NVML failed: {exc} (pynvml: {type(exc).__name__})"


def _s(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@dataclass(eq=False, slots=True)
class _GpmBuf:
    """Two GPM sample buffers (previous, current) and when the previous one was taken."""

    gpm_prev: object = None  # pynvml's GPM sample buffers
    gpm_cur: object = None
    gpm_prev_t: float | None = None
    key: frozenset[str] = frozenset()  # MIG: the GPU instance's device UUIDs (new set = new GI)


@dataclass(eq=False, slots=True)
class _Step:
    """A GPM sample taken and not yet turned into figures, when, and the SM clock then (MHz; None unread)."""

    buf: object
    t: float
    clock: float | None


def steady_runs(clocks: list[float | None]) -> list[tuple[int, int]]:
    """Split GPM sample points into runs ``(first, last)`` that share an end, each as long as the SM clock read
    at every point of it stayed within GPM_STEADY_CLOCK of itself (an unread clock ends a run): one metrics
    call per run is then time-weighted, and a step across a clock change is a run of its own."""
    runs = []
    a = 0
    while a < len(clocks) - 1:
        b = a + 1
        lo = hi = clocks[a] or 0.0
        while lo > 0 and b < len(clocks):
            c = clocks[b] or 0.0
            lo, hi = min(lo, c), max(hi, c)
            if lo <= 0 or hi > GPM_STEADY_CLOCK * lo:
                break
            b += 1
        b = max(b - 1, a + 1)  # the last point that kept the run steady; one step at least
        runs.append((a, b))
        a = b
    return runs


@dataclass(eq=False, slots=True, kw_only=True)
class _Dev(_GpmBuf):
    """Per-GPU handle and state of the real sampler, with the GPU's own GPM sample buffers."""

    handle: object  # pynvml's device handle
    info: GpuInfo
    util_ts: int = 0  # last seen utilization-sample timestamp (us)
    proc_ts: int = 0  # last seen per-process utilization-sample timestamp (us; CPU clock, as NVML's)
    util_buffer_ok: bool = True
    mem_v2: bool = True
    gpm_capable: bool = False  # the GPU supports GPM (even if device-level sampling is refused)
    mig_gpm_reason: str | None = None  # why GPU instances get no GPM, when they do not
    mig_bufs: dict[int, _GpmBuf] = field(default_factory=dict)  # GPU instance id -> its GPM buffers
    mig_cache: dict[str, MigInfo] = field(default_factory=dict)  # MIG device UUID -> identity (asked once)
    # The GPU's own GPM (not MIG): gpm_prev is the anchor, the last sample figures were computed to.
    anchor_clock: float | None = None
    steps: list[_Step] = field(default_factory=list)
    pool: list[object] = field(default_factory=list)  # free sample buffers
    done: list[tuple[dict[str, float | None], float]] = field(default_factory=list)  # figures not yet returned


class NvmlSampler:
    """The real sampler: NVML for kernel activity, memory, power and energy; GPM where the GPU has it."""

    def __init__(self) -> None:
        self._nvml: Any = None  # the pynvml module once open (untyped)
        self._devs: list[_Dev] = []
        self._gpm_ids: list[tuple[str, int]] = []
        self._gpm_kernel = False  # this pynvml knows GRAPHICS_UTIL

    def open(self) -> list[GpuInfo]:
        import pynvml as nv  # noqa: PLC0415 - lazy on purpose (hook path stays stdlib-only)

        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise CollectorError(explain_nvml_error(nv, exc)) from None
        self._nvml = nv
        self._gpm_ids = [(m, getattr(nv, c)) for m, c in (*GPM_METRICS.items(), GPM_KERNEL) if hasattr(nv, c)]
        try:
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            raise CollectorError(f"NVML cannot count GPUs: {exc}") from None
        infos = []
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _s(nv.nvmlDeviceGetUUID(h))
            except nv.NVMLError as exc:
                log.warning("GPU at NVML index %d is not usable, skipped: %s", i, exc)
                continue
            minor = self._try(nv.nvmlDeviceGetMinorNumber, h)
            pci = self._try(nv.nvmlDeviceGetPciInfo, h)
            name = self._try(nv.nvmlDeviceGetName, h)
            mem = self._try(nv.nvmlDeviceGetMemoryInfo, h)
            info = GpuInfo(uuid=uuid, index=i, minor=minor, pci_bus_id=_s(pci.busId) if pci is not None else None,
                           model=_s(name) if name is not None else None, mig_enabled=self._mig_enabled(h),
                           memory_total_bytes=int(mem.total) if mem is not None else None, gpm_supported=False)
            dev = _Dev(handle=h, info=info)
            self._setup_gpm(dev)
            dev.mig_gpm_reason = info.gpm_reason if not dev.gpm_capable else None  # read in MIG mode only
            # Prime the utilization buffer: later samples average only readings newer than this.
            self._kernel_pct(dev)
            self._devs.append(dev)
            infos.append(info)
        if not infos:
            raise CollectorError("NVML sees no usable GPU on this node")
        self._gpm_kernel = hasattr(nv, GPM_KERNEL[1])
        return infos

    def _try(self, fn: Callable[..., Any], *args: object) -> Any:
        try:
            return fn(*args)
        except self._nvml.NVMLError:
            return None

    def _setup_gpm(self, dev: _Dev) -> None:
        nv = self._nvml
        info = dev.info
        if not hasattr(nv, "nvmlGpmQueryDeviceSupport"):
            info.gpm_reason = "this pynvml has no GPM API (upgrade nvidia-ml-py)"
            return
        try:
            supported = bool(nv.nvmlGpmQueryDeviceSupport(dev.handle).isSupportedDevice)
        except nv.NVMLError as exc:
            info.gpm_reason = f"{NO_GPM_REASON} (GPM query failed: {exc})"
            return
        if not supported:
            info.gpm_reason = NO_GPM_REASON
            return
        dev.gpm_capable = True
        why = self._prime(dev, functools.partial(nv.nvmlGpmSampleGet, dev.handle))
        if why is not None:
            info.gpm_reason = f"GPM sampling refused: {why} (profiling restricted to admin?)"
            dev.gpm_prev = dev.gpm_cur = None
            return
        info.gpm_supported = True
        dev.anchor_clock = self._clock(dev)
        dev.pool.append(dev.gpm_cur)
        dev.gpm_cur = None

    def _prime(self, buf: _GpmBuf, take: Callable[[object], object]) -> str | None:
        """Allocate both GPM buffers and take the first sample (figures start at the next one); why not."""
        nv = self._nvml
        try:
            buf.gpm_prev = nv.nvmlGpmSampleAlloc()
            buf.gpm_cur = nv.nvmlGpmSampleAlloc()
            take(buf.gpm_prev)
            buf.gpm_prev_t = time.monotonic()
        except nv.NVMLError as exc:
            return str(exc)
        return None

    def _kernel_pct(self, dev: _Dev) -> float | None:
        """Mean utilization.gpu over the readings since the last call (buffer), else the latest reading."""
        nv = self._nvml
        if dev.util_buffer_ok:
            try:
                vals = self._util_buffer(dev)
                if vals:
                    return sum(vals) / len(vals)
            except nv.NVMLError_NotFound:
                pass  # no reading newer than the last one: fall through to the latest reading
            except nv.NVMLError as exc:
                log.info("GPU %s: utilization sample buffer unavailable (%s); using latest reading",
                         dev.info.uuid, exc)
                dev.util_buffer_ok = False
        try:
            return float(nv.nvmlDeviceGetUtilizationRates(dev.handle).gpu)
        except nv.NVMLError:
            return None

    def _util_buffer(self, dev: _Dev) -> list[float]:
        """Utilization readings newer than the last seen one (the driver's ring buffer): the largest part
        of a tick's CPU time (docs/gpu-validation/h100-agent-overhead.log)."""
        nv = self._nvml
        vtype, samples = nv.nvmlDeviceGetSamples(dev.handle, nv.NVML_GPU_UTILIZATION_SAMPLES, dev.util_ts)
        vals = []
        newest = dev.util_ts
        for smp in samples:
            if smp.timeStamp <= dev.util_ts:
                continue
            v = smp.sampleValue.dVal if vtype == nv.NVML_VALUE_TYPE_DOUBLE else smp.sampleValue.uiVal
            vals.append(float(v))
            newest = max(newest, int(smp.timeStamp))
        dev.util_ts = newest
        return vals

    def _memory_used(self, dev: _Dev, handle: object = None) -> int | None:
        """Memory used of the GPU, or of a MIG device when ``handle`` is one (its GPU instance's memory)."""
        nv = self._nvml
        h = dev.handle if handle is None else handle
        if dev.mem_v2 and hasattr(nv, "nvmlMemory_v2"):
            try:
                return int(nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used)
            except (nv.NVMLError, TypeError):
                dev.mem_v2 = False
        try:
            return int(nv.nvmlDeviceGetMemoryInfo(h).used)
        except nv.NVMLError:
            return None

    def _gpm(self, dev: _GpmBuf, out: GpuSample | MigSample, take: Callable[[object], object]) -> None:
        """One GPM reading into ``out``: ``take(sample)`` fills the current buffer (a GPU's or a GPU instance's)."""
        nv = self._nvml
        if dev.gpm_prev_t is not None and time.monotonic() - dev.gpm_prev_t < GPM_SKIP_S:
            return
        try:
            take(dev.gpm_cur)
        except nv.NVMLError as exc:
            out.errors["gpm"] = f"GPM sample failed: {exc}"
            return
        t = time.monotonic()
        dt = t - dev.gpm_prev_t if dev.gpm_prev_t is not None else None
        try:
            values = self._metrics(dev.gpm_prev, dev.gpm_cur, out.errors)
            if values is not None:
                out.gpm = values
                out.gpm_dt = dt
        finally:
            # The current sample becomes the previous one either way.
            dev.gpm_prev, dev.gpm_cur = dev.gpm_cur, dev.gpm_prev
            dev.gpm_prev_t = t

    def _metrics(self, s1: object, s2: object, errors: dict[str, str]) -> dict[str, float | None] | None:
        """The GPM figures between two samples (NaN or a per-metric error: None); None when the call fails."""
        nv = self._nvml
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = len(self._gpm_ids)
            mg.sample1, mg.sample2 = s1, s2
            for i, (_, mid) in enumerate(self._gpm_ids):
                mg.metrics[i].metricId = mid
            nv.nvmlGpmMetricsGet(mg)
        except nv.NVMLError as exc:
            errors["gpm"] = f"GPM metrics failed: {exc}"
            return None
        values: dict[str, float | None] = {}
        for i, (name, _) in enumerate(self._gpm_ids):
            m = mg.metrics[i]
            v = float(m.value)
            values[name] = v if m.nvmlReturn == nv.NVML_SUCCESS and math.isfinite(v) else None
        return values

    def _clock(self, dev: _Dev) -> float | None:
        nv = self._nvml
        try:
            return float(nv.nvmlDeviceGetClockInfo(dev.handle, nv.NVML_CLOCK_SM))
        except (nv.NVMLError, AttributeError):
            return None

    def _step(self, dev: _Dev, errors: dict[str, str]) -> None:
        """Take one GPM sample of the GPU (not closer than GPM_SKIP_S to the previous one) for later figures."""
        nv = self._nvml
        last = dev.steps[-1].t if dev.steps else dev.gpm_prev_t
        if last is not None and time.monotonic() - last < GPM_SKIP_S:
            return
        try:
            buf = dev.pool.pop() if dev.pool else nv.nvmlGpmSampleAlloc()
        except nv.NVMLError as exc:
            errors["gpm"] = f"GPM sample buffer: {exc}"
            return
        try:
            nv.nvmlGpmSampleGet(dev.handle, buf)
        except nv.NVMLError as exc:
            dev.pool.append(buf)
            errors["gpm"] = f"GPM sample failed: {exc}"
            return
        dev.steps.append(_Step(buf, time.monotonic(), self._clock(dev)))
        if len(dev.steps) >= GPM_MAX_STEPS:
            self._figures(dev, errors)

    def _figures(self, dev: _Dev, errors: dict[str, str]) -> None:
        """Turn the waiting samples into figures (``done``); the newest sample becomes the anchor."""
        if not dev.steps or dev.gpm_prev_t is None:
            return
        points = [_Step(dev.gpm_prev, dev.gpm_prev_t, dev.anchor_clock), *dev.steps]
        for a, b in steady_runs([p.clock for p in points]):
            values = self._metrics(points[a].buf, points[b].buf, errors)
            if values is not None:
                dev.done.append((values, points[b].t - points[a].t))
        dev.pool.append(dev.gpm_prev)
        dev.pool.extend(p.buf for p in dev.steps[:-1])
        while len(dev.pool) > GPM_POOL:  # a long interval's buffers: keep what a default interval reuses
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlGpmSampleFree(dev.pool.pop())
        dev.gpm_prev, dev.gpm_prev_t, dev.anchor_clock = dev.steps[-1].buf, dev.steps[-1].t, dev.steps[-1].clock
        dev.steps = []

    def _gpm_reading(self, dev: _Dev, s: GpuSample) -> None:
        """A full reading's GPM: a sample now, and every waiting sample turned into figures (``gpm_steps``)."""
        self._step(dev, s.errors)
        self._figures(dev, s.errors)
        if dev.done:
            s.gpm_steps, dev.done = dev.done, []
            s.gpm, s.gpm_dt = s.gpm_steps[-1]

    def _mig_enabled(self, handle: object) -> bool:
        """MIG mode is on now (changing it needs a GPU reset, so once at open is enough)."""
        nv = self._nvml
        try:
            current, _pending = nv.nvmlDeviceGetMigMode(handle)
        except (nv.NVMLError, AttributeError):  # NotSupported on GPUs without MIG
            return False
        return bool(current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))

    def _mig_devices(self, dev: _Dev) -> list[tuple[object, MigInfo]]:
        """The MIG devices that exist now, with their handles; identity asked once per MIG device UUID."""
        nv = self._nvml
        try:
            count = int(nv.nvmlDeviceGetMaxMigDeviceCount(dev.handle))
        except nv.NVMLError:
            return []
        out = []
        for i in range(count):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev.handle, i)
                uuid = _s(nv.nvmlDeviceGetUUID(mh))
            except nv.NVMLError:  # NotFound: no MIG device at this index
                continue
            info = dev.mig_cache.get(uuid)
            if info is None:
                try:
                    gi = int(nv.nvmlDeviceGetGpuInstanceId(mh))
                except nv.NVMLError as exc:
                    log.warning("MIG device %s of %s: no GPU instance id (%s); skipped", uuid, dev.info.uuid, exc)
                    continue
                ci = self._try(nv.nvmlDeviceGetComputeInstanceId, mh)
                name = self._try(nv.nvmlDeviceGetName, mh)
                mem = self._try(nv.nvmlDeviceGetMemoryInfo, mh)
                info = MigInfo(uuid=uuid, parent_uuid=dev.info.uuid, gi_id=gi,
                               ci_id=int(ci) if ci is not None else None,
                               profile=profile_from_name(_s(name)) if name is not None else None,
                               memory_total_bytes=int(mem.total) if mem is not None else None)
                dev.mig_cache[uuid] = info
            out.append((mh, info))
        return out

    def _sample_mig(self, dev: _Dev, s: GpuSample) -> None:
        nv = self._nvml
        devices = self._mig_devices(dev)
        s.mig_devices = [info for _, info in devices]
        by_gi: dict[int, list[tuple[object, MigInfo]]] = {}
        for mh, info in devices:
            by_gi.setdefault(info.gi_id, []).append((mh, info))
        s.mig = {}
        for gi, members in by_gi.items():
            ms = MigSample(gi_id=gi, memory_used_bytes=self._memory_used(dev, members[0][0]))
            key = frozenset(info.uuid for _, info in members)
            if dev.mig_gpm_reason is not None:
                ms.gpm_reason = dev.mig_gpm_reason
            else:
                take = functools.partial(nv.nvmlGpmMigSampleGet, dev.handle, gi)
                buf = dev.mig_bufs.get(gi)
                if buf is not None and buf.key != key:  # GPU instance re-created: old samples are another GI's
                    self._free(buf)
                    buf = None
                if buf is not None:
                    self._gpm(buf, ms, take)
                else:  # the GPU instance's first GPM sample: its figures start at the next tick
                    buf = _GpmBuf(key=key)
                    why = self._prime(buf, take)
                    if why is None:
                        dev.mig_bufs[gi] = buf
                    else:
                        ms.errors["gpm"] = f"GPM MIG sampling refused for GPU instance {gi}: {why}"
                        self._free(buf)
            s.mig[gi] = ms
        for gi in [g for g in dev.mig_bufs if g not in by_gi]:  # destroyed GPU instances
            self._free(dev.mig_bufs.pop(gi))
        for u in [u for u, i in dev.mig_cache.items() if i.gi_id not in by_gi]:
            del dev.mig_cache[u]

    def _free(self, buf: _GpmBuf) -> None:
        nv = self._nvml
        for smp in (buf.gpm_prev, buf.gpm_cur):
            if smp is not None:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(smp)
        buf.gpm_prev = buf.gpm_cur = None

    def sample(self, read_energy: bool, gpm_for: set[str] | None = None) -> list[GpuSample]:
        nv = self._nvml
        out = []
        for dev in self._devs:
            s = GpuSample(uuid=dev.info.uuid, t=time.monotonic())
            if not (dev.info.gpm_supported and self._gpm_kernel):  # else GPM's kernel_active (GPM_KERNEL)
                s.kernel_pct = self._kernel_pct(dev)
            s.memory_used_bytes = self._memory_used(dev)
            try:
                s.power_mw = float(nv.nvmlDeviceGetPowerUsage(dev.handle))
            except nv.NVMLError as exc:
                s.errors["power"] = str(exc)
            if read_energy:
                try:
                    s.energy_mj = int(nv.nvmlDeviceGetTotalEnergyConsumption(dev.handle))
                except nv.NVMLError as exc:
                    s.errors["energy"] = str(exc)
            if dev.info.gpm_supported and (gpm_for is None or dev.info.uuid in gpm_for):
                self._gpm_reading(dev, s)
            elif dev.info.gpm_supported:
                self._step(dev, s.errors)
            if dev.info.mig_enabled:
                self._sample_mig(dev, s)
            out.append(s)
        return out

    def sample_gpm(self) -> list[GpuSample]:
        """Samples only: their figures come with the next reading (GPM_STEADY_CLOCK)."""
        for dev in self._devs:
            if dev.info.gpm_supported:
                errors: dict[str, str] = {}
                self._step(dev, errors)
                if errors:
                    log.debug("GPU %s: %s", dev.info.uuid, errors["gpm"])
        return []

    def sample_processes(self, uuids: set[str], since: float, busy: set[str] | None = None) -> dict[str, ProcSample]:
        nv = self._nvml
        out = {}
        for dev in self._devs:
            if dev.info.uuid not in uuids:
                continue
            ps = out[dev.info.uuid] = ProcSample(uuid=dev.info.uuid)
            try:
                for p in nv.nvmlDeviceGetComputeRunningProcesses(dev.handle):
                    used = getattr(p, "usedGpuMemory", None)  # None: not available (pynvml's translation)
                    ps.memory[int(p.pid)] = int(used) if isinstance(used, int) else None
            except nv.NVMLError as exc:
                ps.error = f"NVML could not list the GPU's processes: {exc}"
            dev.proc_ts = max(dev.proc_ts, int(since * 1e6))  # NVML's sample times: CPU clock, microseconds
            if busy is not None and dev.info.uuid not in busy:
                continue  # no kernel ran: nothing to split, and this is the costlier call of the two
            try:
                samples = nv.nvmlDeviceGetProcessUtilization(dev.handle, dev.proc_ts)
            except nv.NVMLError_NotFound:
                continue  # no sample newer than the last one: no process had kernels since
            except nv.NVMLError as exc:
                ps.error = f"NVML per-process utilization failed: {exc}"
                continue
            newest = dev.proc_ts
            for smp in samples:
                ts = int(smp.timeStamp)
                if ts <= dev.proc_ts:
                    continue
                newest = max(newest, ts)
                v = float(smp.smUtil)
                if 0 < v <= 100:  # NVML reports unknown as a huge value
                    ps.sm[int(smp.pid)] = ps.sm.get(int(smp.pid), 0.0) + v
            dev.proc_ts = newest
        return out

    def close(self) -> None:
        nv = self._nvml
        if nv is None:
            return
        for dev in self._devs:
            self._free(dev)
            for smp in [*dev.pool, *(st.buf for st in dev.steps)]:
                with contextlib.suppress(nv.NVMLError):
                    nv.nvmlGpmSampleFree(smp)
            dev.pool, dev.steps = [], []
            for buf in dev.mig_bufs.values():
                self._free(buf)
        self._devs = []
        with contextlib.suppress(nv.NVMLError):
            nv.nvmlShutdown()
        self._nvml = None
