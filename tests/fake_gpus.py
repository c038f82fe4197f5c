"""The GPU mock for the nvml backend's CPU tests: a fake sampler fed into the *real* agent.

Only the GPU is faked. :class:`FakeSampler` implements the same interface as
``slurm_gpueff.node.nvml_sampler.NvmlSampler`` (``open``/``sample``/``close``) and returns
scripted readings at times set by a :class:`FakeClock`; the agent's loop, integrals, state file,
timeline files and the hook-side collector under test are all the real code.
"""

from __future__ import annotations

import math
import os
from typing import Any

from slurm_gpueff.config import Config
from slurm_gpueff.node.nvml_sampler import GPM_METRICS, NO_GPM_REASON, GpuInfo, GpuSample, ProcSample

GiB = 1024**3


class FakeClock:
    """Monotonic seconds (``mono``) and a matching wall clock (``wall()``) that tests advance by hand."""

    def __init__(self, wall0: float = 1_750_000_000.0):
        self.wall0 = wall0
        self.mono = 100.0

    def wall(self) -> float:
        return self.wall0 + self.mono

    def advance(self, dt: float) -> None:
        self.mono += dt


def hopper(uuid: str, index: int = 0, minor: int | None = None) -> GpuInfo:
    return GpuInfo(uuid=uuid, index=index, minor=index if minor is None else minor,
                   pci_bus_id=f"00000000:{0x18 + index:02X}:00.0", model="NVIDIA H100 80GB HBM3",
                   memory_total_bytes=80 * GiB, gpm_supported=True)


def ampere(uuid: str, index: int = 0, minor: int | None = None) -> GpuInfo:
    return GpuInfo(uuid=uuid, index=index, minor=index if minor is None else minor,
                   pci_bus_id=f"00000000:{0x18 + index:02X}:00.0", model="NVIDIA A100-SXM4-40GB",
                   memory_total_bytes=40 * GiB, gpm_supported=False, gpm_reason=NO_GPM_REASON)


class FakeSampler:
    """Scripted GPUs. ``set(uuid, ...)`` sets what the next samples return (held until changed).

    Readings behave like NVML's: ``energy_mj`` only when the agent asks for it (it integrates the
    fake power itself, so it is consistent with ``power_mw``); GPM values are given as percentages
    and returned with ``gpm_dt`` = time since the previous sample, ``None`` on the first sample.
    """

    def __init__(self, clock: FakeClock, gpus: list[GpuInfo], fail_open: str | None = None):
        self.clock = clock
        self.infos = gpus
        self.fail_open = fail_open
        self.values: dict[str, dict[str, Any]] = {
            g.uuid: {"kernel_pct": 0.0, "memory_used_bytes": 1 * GiB, "power_mw": 70_000.0, "gpm": {},
                     "errors": {}} for g in gpus}
        self.energy: dict[str, float] = {g.uuid: 5_000_000.0 for g in gpus}
        self.last_t: float | None = None
        self.gpm_last_t: float | None = None  # GPM intervals run from GPM sample to GPM sample (sample_gpm too)
        self.gpm_calls = 0
        self.energy_reads = 0
        self.calls = 0
        self.closed = False
        # Per GPU: its compute processes' SM utilization (percent, one sample a second) and memory.
        self.procs: dict[str, dict[str, dict[int, Any]]] = {g.uuid: {"sm": {}, "memory": {}} for g in gpus}
        self.prev_t: float | None = None  # the full reading before the last one
        self.proc_calls: list[set[str]] = []
        self.util_calls: list[set[str]] = []  # the GPUs whose per-process utilization was read, per call

    def open(self) -> list[GpuInfo]:
        if self.fail_open:
            from slurm_gpueff.errors import CollectorError

            raise CollectorError(self.fail_open)
        return list(self.infos)

    def set(self, uuid: str, **values: Any) -> None:
        self.values[uuid].update(values)

    def sample(self, read_energy: bool, gpm_for: set[str] | None = None) -> list[GpuSample]:
        t = self.clock.mono
        dt = t - self.last_t if self.last_t is not None else None
        out = []
        for g in self.infos:
            v = self.values[g.uuid]
            if dt is not None and v["power_mw"] is not None:
                self.energy[g.uuid] += v["power_mw"] * dt  # mW x s = mJ
            s = GpuSample(uuid=g.uuid, t=t, kernel_pct=v["kernel_pct"], memory_used_bytes=v["memory_used_bytes"],
                          power_mw=v["power_mw"], errors=dict(v["errors"]))
            if read_energy:
                s.energy_mj = int(round(self.energy[g.uuid]))
            self._gpm(g, s)
            out.append(s)
        self.energy_reads += int(read_energy)
        self.calls += 1
        self.prev_t = self.last_t
        self.last_t = self.gpm_last_t = t
        return out

    def _gpm(self, g: GpuInfo, s: GpuSample) -> None:
        if g.gpm_supported and self.gpm_last_t is not None:
            gpm = self.values[g.uuid]["gpm"]
            s.gpm = {m: gpm.get(m) for m in GPM_METRICS}
            if "kernel_active" in gpm:  # GPM's GRAPHICS_UTIL, as NvmlSampler reads kernel activity on GPM GPUs
                s.gpm["kernel_active"] = gpm["kernel_active"]
            s.gpm_dt = s.t - self.gpm_last_t

    def sample_gpm(self) -> list[GpuSample]:
        """GPM only, between the agent's full readings (as NvmlSampler.sample_gpm)."""
        t = self.clock.mono
        out = []
        for g in self.infos:
            s = GpuSample(uuid=g.uuid, t=t)
            self._gpm(g, s)
            out.append(s)
        self.gpm_calls += 1
        self.gpm_last_t = t
        return out

    def set_procs(self, uuid: str, sm: dict[int, float], memory: dict[int, int | None]) -> None:
        self.procs[uuid] = {"sm": dict(sm), "memory": dict(memory)}

    def sample_processes(self, uuids: set[str], since: float, busy: set[str] | None = None) -> dict[str, ProcSample]:
        """As NvmlSampler's: each process's SM percent summed over one sample a second since the previous
        reading (``since``, a wall time, stands for it; the fake counts from its previous ``sample``), for the
        GPUs in ``busy`` only (None: all)."""
        t = self.clock.mono
        self.proc_calls.append(set(uuids))
        self.util_calls.append(set(uuids) if busy is None else set(uuids) & busy)
        out = {}
        for u in uuids:
            n = max(0, round(t - (self.prev_t if self.prev_t is not None else t)))
            if busy is not None and u not in busy:
                n = 0
            p = self.procs[u]
            out[u] = ProcSample(uuid=u, sm={pid: pct * n for pid, pct in p["sm"].items() if pct * n > 0},
                                memory=dict(p["memory"]))
        return out

    def close(self) -> None:
        self.closed = True


def make_config(tmp_path: Any, **agent: Any) -> Config:
    state = os.path.join(str(tmp_path), "state")
    data: dict[str, Any] = {"paths": {"state_dir": state, "spool_dir": os.path.join(str(tmp_path), "spool")},
                            "collector": {"backend": "nvml", "agent_stale_s": 30.0}}
    if agent:
        data["agent"] = agent
    return Config(data, source="<test>")


def make_dev_dir(tmp_path: Any, minors: list[int]) -> str:
    """A directory standing in for /dev with nvidiaN entries (plus the non-GPU nodes a real one has)."""
    d = os.path.join(str(tmp_path), "dev")
    os.makedirs(d, exist_ok=True)
    for n in [f"nvidia{m}" for m in minors] + ["nvidiactl", "nvidia-uvm", "nvidia-caps"]:
        open(os.path.join(d, n), "w").close()
    return d


def close(a: float | None, b: float, tol: float = 1e-9) -> bool:
    return a is not None and math.isclose(a, b, rel_tol=tol, abs_tol=tol)
