"""GPU identity (Slurm index -> /dev minor -> UUID / PCI bus id) and which MIG slice is which (MIG UUID ->
parent GPU UUID, GPU/compute instance ids, profile and memory).

DCGM numbers GPUs its own way, so the join key is the GPU UUID (or PCI bus id), never an ordinal. The
driver publishes both per minor in ``/proc/driver/nvidia/gpus/<bus id>/information``: a file read, never
a driver call that could hang a hook. MIG UUIDs are opaque since R470 and say nothing by themselves: the
agent's MIG inventory answers, else the legacy ``MIG-GPU-<parent uuid>/<gi>/<ci>`` (which names the parent
and instance ids), else NVML (pynvml imported only inside :func:`nvml_lookup`).
"""

from __future__ import annotations

import os
import re

from ..slurm.hookenv import MAX_GPU_INDEX, is_mig_uuid, number
from .agent_files import read_state

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

PROC_GPUS = "/proc/driver/nvidia/gpus"

_BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$", re.ASCII)


def normalize_bus_id(bus_id: str | None) -> str | None:
    """One spelling for a PCI bus id: ``0000:3b:00.0`` (NVML and DCGM write ``00000000:3B:00.0``)."""
    m = _BUS.match(bus_id.strip()) if bus_id else None
    if not m:
        return None
    domain, bus, dev, fn = m.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{fn}"


def parse_proc_information(text: str) -> dict[str, Any]:
    """The fields we use from one ``information`` file (missing ones are None)."""
    out: dict[str, Any] = {"minor": None, "uuid": None, "pci_bus_id": None, "model": None}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "Device Minor" and value.isascii() and value.isdigit():
            out["minor"] = int(value)
        elif key == "GPU UUID" and value.startswith("GPU-"):
            out["uuid"] = value
        elif key == "Bus Location":
            out["pci_bus_id"] = normalize_bus_id(value)
        elif key == "Model":
            out["model"] = value
    return out


def proc_gpus(proc_dir: str = PROC_GPUS) -> dict[int, dict[str, Any]]:
    """minor -> {minor, uuid, pci_bus_id, model} for every GPU the driver lists (empty without a driver)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        entries = sorted(os.listdir(proc_dir))
    except OSError:
        return out
    for name in entries:
        try:
            with open(os.path.join(proc_dir, name, "information")) as fh:
                info = parse_proc_information(fh.read())
        except OSError:
            continue
        if info["pci_bus_id"] is None:
            info["pci_bus_id"] = normalize_bus_id(name)
        if info["minor"] is not None:
            out[info["minor"]] = info
    return out


def parse_legacy_mig(uuid: str) -> dict[str, Any] | None:
    """``MIG-GPU-<parent>/<gi>/<ci>`` -> {parent_uuid, gi_id, ci_id}; None for the opaque R470+ form."""
    m = _LEGACY_MIG.match(uuid.strip())
    return {"parent_uuid": m.group(1), "gi_id": int(m.group(2)), "ci_id": int(m.group(3))} if m else None


def _split(value: str | None) -> list[str]:
    return [p.strip() for p in (value or "").split(",") if p.strip()]


def job_slices(env: Mapping[str, str]) -> list[tuple[int, str]]:
    """The MIG slices a job holds as ``[(slurm_index, mig_uuid), ...]``; ``[]`` for whole-GPU jobs. Slurm with
    MIG GRES gives SLURM_JOB_GPUS as GRES indexes and CUDA_VISIBLE_DEVICES as the slices' MIG UUIDs, position by
    position: pair them. Without a matching index list, a slice's position is its index."""
    job_gpus = _split(env.get("SLURM_JOB_GPUS"))
    cuda = _split(env.get("CUDA_VISIBLE_DEVICES"))
    for source in (job_gpus, cuda):
        migs = [p for p in source if is_mig_uuid(p)]  # anything else MIG-like is junk (slurm/hookenv.py says so)
        if not migs:
            continue
        indexes = [n for n in (number(p, MAX_GPU_INDEX) for p in job_gpus) if n is not None]
        if source is cuda and len(indexes) == len(migs):
            return list(zip(indexes, migs, strict=True))
        return list(enumerate(migs))
    return []


# Why figures are missing on a slice.
JOBSTATS_REASON = "DCGM job statistics do not cover MIG slices"
UTIL_REASON = "not measurable per MIG slice (NVML utilization and energy are whole-GPU only)"
KERNEL_MIG_REASON = ("not measurable per MIG slice: NVML utilization.gpu is whole-GPU only "
                     "(SM activity is measured per slice instead)")
ENERGY_MIG_REASON = ("not attributed to a MIG slice: NVML power and energy are whole-GPU only "
                     "(the physical GPU is shared with other slices)")
NO_GPM_MIG_REASON = "no GPM MIG sample for this slice (pre-Hopper GPU, or the agent has no MIG sampling)"


def profile_from_name(name: str | None) -> str | None:
    """``NVIDIA H100 80GB HBM3 MIG 1g.10gb`` -> ``1g.10gb``."""
    _, sep, tail = (name or "").rpartition("MIG ")
    return (tail.strip() or None) if sep else None


def nvml_lookup(mig_uuid: str) -> dict[str, Any]:
    """Ask NVML about one MIG device (lazy pynvml import); raises on any failure."""
    import pynvml as nv  # noqa: PLC0415 - lazy on purpose (hook path stays stdlib-only at import)

    nv.nvmlInit()
    try:
        h = nv.nvmlDeviceGetHandleByUUID(mig_uuid)
        parent = nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(h)
        name = nv.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else name
        uuid = nv.nvmlDeviceGetUUID(parent)
        out: dict[str, Any] = {
            "mig_uuid": mig_uuid,
            "parent_uuid": uuid.decode() if isinstance(uuid, bytes) else uuid,
            "gi_id": int(nv.nvmlDeviceGetGpuInstanceId(h)),
            "ci_id": int(nv.nvmlDeviceGetComputeInstanceId(h)),
            "profile": profile_from_name(name),
            "memory_total_bytes": int(nv.nvmlDeviceGetMemoryInfo(h).total),
        }
        try:
            out["parent_minor"] = int(nv.nvmlDeviceGetMinorNumber(parent))
        except nv.NVMLError:
            out["parent_minor"] = None
        return out
    finally:
        nv.nvmlShutdown()


def agent_inventory(state_dir: str) -> dict[str, dict[str, Any]]:
    """The agent's MIG inventory ``{mig_uuid: {...}}`` (empty if none)."""
    mig = read_state(state_dir).get("mig")
    return mig if isinstance(mig, dict) else {}


def resolve(mig_uuid: str, inventory: dict[str, dict[str, Any]] | None = None,
            lookup: Callable[[str], dict[str, Any]] | None = nvml_lookup) -> tuple[dict[str, Any] | None, str | None]:
    """(slice description, None) or (None, why it could not be identified)."""
    legacy = parse_legacy_mig(mig_uuid)
    known = (inventory or {}).get(mig_uuid)
    if isinstance(known, dict) and known.get("parent_uuid") and known.get("gi_id") is not None:
        return {"mig_uuid": mig_uuid, **known}, None
    if legacy is not None:
        return {"mig_uuid": mig_uuid, "profile": None, "memory_total_bytes": None, **legacy}, None
    if lookup is None:
        return None, f"MIG device {mig_uuid} unknown (no agent inventory, NVML not asked)"
    try:
        return lookup(mig_uuid), None
    except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError_NotFound, no driver...
        return None, f"cannot identify MIG device {mig_uuid}: {type(exc).__name__}: {exc}"


def slice_ident(desc: dict[str, Any] | None, mig_uuid: str) -> dict[str, Any]:
    """The record's identity fields for a slice: parent UUID in ``uuid``, the slice in ``mig_*``."""
    d = desc or {}
    return {"uuid": d.get("parent_uuid"), "mig_uuid": mig_uuid, "mig_gi_id": d.get("gi_id"),
            "mig_ci_id": d.get("ci_id"), "mig_profile": d.get("profile"),
            "memory_total_bytes": d.get("memory_total_bytes")}
