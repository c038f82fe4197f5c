"""MIG jobs on the nvml backend: each slice's own figures from the agent's per-GPU-instance counters.

A slice must never be charged the whole GPU's figures: its Slurm index is not a /dev/nvidiaN minor, and
NVML's utilization, energy and power are whole-GPU readings. Each slice is resolved to (parent GPU, GPU
instance) by :mod:`.mig`; what is measured per slice and why the rest is n/a: docs/FIGURES.md "On the
dcgm backend, and on MIG slices".
"""

from __future__ import annotations

from ..record import empty_gpu
from . import integrals
from . import mig as migmod
from .agent_files import mig_key, read_job_timeline
from .gpu_ids import job_slices
from .nvml_sampler import GPM_METRICS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from .base import JobContext

GPM_MIG_METRICS = tuple(GPM_METRICS)
WHOLE_GPU_ONLY = ("kernel_active", "energy_j", "power_mean_w")


def _slice_entry(state: dict[str, Any] | None, desc: dict[str, Any]) -> dict[str, Any] | None:
    """The agent's per-GPU-instance entry for a resolved slice, or None."""
    if not isinstance(state, dict):
        return None
    parent = (state.get("gpus") or {}).get(desc.get("parent_uuid"))
    if not isinstance(parent, dict):
        return None
    sl = (parent.get("mig") or {}).get(str(desc.get("gi_id")))
    return sl if isinstance(sl, dict) else None


def _not_seen(state: dict[str, Any], desc: dict[str, Any]) -> str:
    parent = (state.get("gpus") or {}).get(desc.get("parent_uuid"))
    if not isinstance(parent, dict):
        return f"the gpueff agent does not see the parent GPU {desc.get('parent_uuid')} of this MIG slice"
    if not parent.get("mig_enabled"):
        return f"the gpueff agent sees GPU {desc.get('parent_uuid')} without MIG mode (agent older or started before?)"
    return f"the gpueff agent sees no GPU instance {desc.get('gi_id')} on GPU {desc.get('parent_uuid')}"


def _snapshot(sl: dict[str, Any]) -> dict[str, Any]:
    return {k: sl.get(k) for k in ("sum", "covered_s", "count", "ticks", "gen")} | {
        "n_ci": len(sl.get("devices") or {})}


def start(state_dir: str, job: JobContext, out: dict[str, Any], state: dict[str, Any] | None,
          err: str | None) -> dict[str, Any]:
    """Complete ``out``, the Prolog state (``state``/``err`` from NvmlCollector.read_state): each slice
    resolved while it exists, its counters snapshotted, its UUID in ``uuids`` for the agent's peak memory."""
    inventory = (state.get("mig") if isinstance(state, dict) else None) or migmod.agent_inventory(state_dir)
    out["mig"] = {}
    for idx, mig_uuid in job_slices(job.env):
        desc, why = migmod.resolve(mig_uuid, inventory if isinstance(inventory, dict) else {}, migmod.nvml_lookup)
        entry: dict[str, Any] = {"uuid": mig_uuid, "desc": desc, "error": why}
        out["uuids"].append(mig_uuid)
        if desc is not None and err is None and isinstance(state, dict):
            sl = _slice_entry(state, desc)
            if sl is None:
                entry["slice_error"] = _not_seen(state, desc)
            else:
                entry["snapshot"] = _snapshot(sl)
        out["mig"][str(idx)] = entry
    return out


def stop(job: JobContext, start_state: dict[str, Any] | None, *, state: dict[str, Any] | None, reason: str | None,
         interval_s: float, state_dir: str) -> list[dict[str, Any]]:
    """One record entry per slice: identity from the Prolog's state (or the agent's inventory), figures
    from the difference of the slice's counters; ``reason`` (agent down, restarted, no Prolog state) voids them."""
    saved = (start_state or {}).get("mig") or {}
    gpus = []
    for idx, mig_uuid in job_slices(job.env):
        entry = saved.get(str(idx)) or {}
        desc, why = entry.get("desc"), entry.get("error")
        if desc is None and why is None:
            inventory = state.get("mig") if isinstance(state, dict) else None
            desc, why = migmod.resolve(mig_uuid, inventory if isinstance(inventory, dict) else None, None)
        gpu = empty_gpu(idx, "nvml", why, **migmod.slice_ident(desc, mig_uuid))
        gpus.append(gpu)
        if why:
            continue
        assert desc is not None  # a slice without a reason was resolved
        missing: dict[str, str] = {m: migmod.KERNEL_MIG_REASON if m == "kernel_active" else migmod.ENERGY_MIG_REASON
                                   for m in WHOLE_GPU_ONLY}
        gpu["missing"] = missing
        slice_reason = reason or _slice_reason(entry, state, desc)
        if slice_reason:
            missing.update(dict.fromkeys((*GPM_MIG_METRICS, "memory_used_peak_bytes"), slice_reason))
        else:  # counters to difference: a Prolog snapshot (so a start state) and the slice at job end
            assert start_state is not None and state is not None
            _figures(job, gpu, missing, entry, mig_uuid, desc, start_state, state, interval_s, state_dir)
    return gpus


def _slice_reason(entry: dict[str, Any], state: dict[str, Any] | None, desc: dict[str, Any]) -> str | None:
    """Why this slice's counters cannot be differenced, or None."""
    if entry.get("slice_error"):
        return f"at job start: {entry['slice_error']}"
    snap = entry.get("snapshot")
    if not isinstance(snap, dict):
        return "no counter snapshot from job start for this MIG slice"
    end = _slice_entry(state, desc)
    gi, parent = desc.get("gi_id"), desc.get("parent_uuid")
    if end is None:
        return (f"MIG slice gone at job end: GPU instance {gi} no longer exists on GPU {parent} "
                "(MIG reconfigured during the job); its figures are lost")
    if end.get("gen") != snap.get("gen"):
        return (f"MIG slice reconfigured during the job: GPU instance {gi} on GPU {parent} was destroyed and "
                "re-created, so its counters are not comparable")
    n_ci = max(int(snap.get("n_ci") or 0), len(end.get("devices") or {}))
    if n_ci > 1:
        return (f"GPU instance {gi} is shared by {n_ci} compute instances: GPM and memory are per GPU "
                "instance and cannot be attributed to one compute instance")
    return None


def _figures(job: JobContext, gpu: dict[str, Any], missing: dict[str, str], entry: dict[str, Any], mig_uuid: str,
             desc: dict[str, Any], start_state: dict[str, Any], state: dict[str, Any], interval_s: float,
             state_dir: str) -> None:
    snap = entry["snapshot"]
    end = _slice_entry(state, desc)
    assert end is not None  # _slice_reason checked
    gpm = bool(end.get("gpm_supported"))
    ticks = int(end.get("ticks") or 0) - int(snap.get("ticks") or 0)
    samples = 0
    for m in GPM_MIG_METRICS:
        mean, _cov, n = integrals.window(snap, end, m)
        samples = max(samples, n)
        if mean is not None:
            gpu[m] = round(integrals.clamp_fraction(mean), 6)
        elif not gpm:
            missing[m] = end.get("gpm_reason") or migmod.NO_GPM_MIG_REASON
        else:
            missing[m] = (f"job shorter than one sampling interval ({interval_s:g} s): no agent sample fell inside it"
                          if ticks <= 0 else "GPM MIG sampling returned no valid value during the job")
    gpu["samples"] = samples if samples else max(ticks, 0)
    peak = ((state.get("jobs") or {}).get(str(job.job_id)) or {}).get(mig_uuid)
    if isinstance(peak, int) and peak >= 0:
        gpu["memory_used_peak_bytes"] = peak
    else:
        missing["memory_used_peak_bytes"] = ("the agent saw no memory sample of this slice while the job's state "
                                             "file existed (job shorter than one sampling interval?)")
    if any(gpu[m] is not None for m in GPM_MIG_METRICS):
        gpu["source"] = "nvml-gpm"
    if samples > 0:
        gpu["timeline"] = read_job_timeline(state_dir, mig_key(desc["parent_uuid"], desc["gi_id"]),
                                            {"instance": state.get("instance"), "gen": snap.get("gen")},
                                            job.start_time, start_state, snap, state, end)

