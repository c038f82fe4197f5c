"""The GPU mock for MIG: a fake sampler whose GPUs are in MIG mode, fed into the *real* agent.

Only the GPU is faked (MIG cannot be enabled on the project's GPU machine without a GPU reset).
:class:`FakeMigSampler` extends :class:`fake_gpus.FakeSampler` the way NVML behaves in MIG mode: the
parent GPU has no utilization.gpu (NVML answers NotSupported), its power and energy are whole-GPU,
and every tick reports the MIG devices that exist now plus, per GPU instance, its memory used and
GPM percentages averaged since that GPU instance's previous sample (``None`` on its first sample,
as ``nvmlGpmMigSampleGet`` needs two samples). :meth:`reconfigure` destroys/creates GPU instances.
"""

from __future__ import annotations

from typing import Any

from fake_gpus import FakeClock, FakeSampler, GiB, hopper

from slurm_gpueff.node.nvml_sampler import GPM_METRICS, NO_GPM_REASON, GpuInfo, GpuSample, MigInfo, MigSample

GPM_NAMES = tuple(GPM_METRICS)


def mig_parent(uuid: str, index: int = 0, gpm: bool = True) -> GpuInfo:
    info = hopper(uuid, index)
    info.mig_enabled = True
    if not gpm:
        info.model, info.gpm_supported, info.gpm_reason = "NVIDIA A100-SXM4-40GB", False, NO_GPM_REASON
    return info


def mig_dev(parent: str, gi: int, ci: int = 0, profile: str = "3g.40gb", mem_gib: int = 40,
            uuid: str | None = None) -> MigInfo:
    return MigInfo(uuid=uuid or f"MIG-{gi:08x}-{ci:04x}-5000-8000-{parent[-12:]}", parent_uuid=parent, gi_id=gi,
                   ci_id=ci, profile=profile, memory_total_bytes=mem_gib * GiB)


class FakeMigSampler(FakeSampler):
    """``set_slice(parent, gi, gpm={...}, memory_used_bytes=...)`` scripts one GPU instance's readings."""

    def __init__(self, clock: FakeClock, gpus: list[GpuInfo], devices: dict[str, list[MigInfo]]):
        super().__init__(clock, gpus)
        self.devices = {u: list(ds) for u, ds in devices.items()}
        self.slice_values: dict[tuple[str, int], dict[str, Any]] = {}
        self.slice_last_t: dict[tuple[str, int], float] = {}
        for g in gpus:
            if g.mig_enabled:
                self.set(g.uuid, kernel_pct=None)  # NVML: utilization NotSupported in MIG mode

    def set_slice(self, parent: str, gi: int, **values: Any) -> None:
        self.slice_values.setdefault((parent, gi), {"gpm": {}, "memory_used_bytes": 1 * GiB}).update(values)

    def reconfigure(self, parent: str, devices: list[MigInfo]) -> None:
        """Destroy all GPU instances of ``parent`` and create ``devices`` (new GIs start a new GPM series)."""
        self.devices[parent] = list(devices)
        for key in [k for k in self.slice_last_t if k[0] == parent]:
            del self.slice_last_t[key]

    def sample(self, read_energy: bool, gpm_for: set[str] | None = None) -> list[GpuSample]:
        out = super().sample(read_energy)
        t = self.clock.mono
        for s in out:
            info = next(g for g in self.infos if g.uuid == s.uuid)
            if not info.mig_enabled:
                continue
            s.mig_devices = list(self.devices.get(s.uuid, []))
            s.mig = {}
            for gi in sorted({d.gi_id for d in s.mig_devices}):
                v = self.slice_values.setdefault((s.uuid, gi), {"gpm": {}, "memory_used_bytes": 1 * GiB})
                ms = MigSample(gi_id=gi, memory_used_bytes=v["memory_used_bytes"])
                last = self.slice_last_t.get((s.uuid, gi))
                if not info.gpm_supported:
                    ms.gpm_reason = NO_GPM_REASON
                elif last is not None:
                    ms.gpm = {m: v["gpm"].get(m) for m in GPM_NAMES}
                    ms.gpm_dt = t - last
                self.slice_last_t[(s.uuid, gi)] = t
                s.mig[gi] = ms
        return out
