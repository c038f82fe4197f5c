"""GPU identity without NVML: Slurm index -> /dev minor -> UUID / PCI bus id, and MIG slice ids.

DCGM numbers GPUs its own way, so the join key is the GPU UUID (or PCI bus id), never an ordinal. The
driver publishes both per minor in ``/proc/driver/nvidia/gpus/<bus id>/information``: a file read, never
a driver call that could hang a hook. MIG UUIDs are opaque since R470; the legacy
``MIG-GPU-<parent uuid>/<gi>/<ci>`` names the parent and instance ids.
"""

from __future__ import annotations

import os
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

PROC_GPUS = "/proc/driver/nvidia/gpus"

_BUS = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")
_LEGACY_MIG = re.compile(r"^MIG-(GPU-[0-9a-fA-F-]+)/(\d+)/(\d+)$")


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
        if key == "Device Minor" and value.isdigit():
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
        migs = [p for p in source if p.startswith("MIG-")]
        if not migs:
            continue
        indexes = [int(p) for p in job_gpus if p.isdigit()]
        if source is cuda and len(indexes) == len(migs):
            return list(zip(indexes, migs, strict=True))
        return list(enumerate(migs))
    return []
