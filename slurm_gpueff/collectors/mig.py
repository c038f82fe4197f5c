"""Which MIG slice is which: MIG UUID -> parent GPU UUID, GPU/compute instance ids, profile and memory.

The opaque R470+ MIG UUID says nothing by itself: the agent's MIG inventory answers, else the legacy form
``MIG-GPU-<parent>/<gi>/<ci>``, else NVML (pynvml imported only inside :func:`nvml_lookup`).
"""

from __future__ import annotations

from .agent_files import read_state
from .gpu_ids import parse_legacy_mig

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

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
