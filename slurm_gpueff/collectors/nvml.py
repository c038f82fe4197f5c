"""Hook side of the nvml backend: difference the node agent's cumulative counters over a job.

Never imports pynvml or talks to a GPU (a hook must not depend on the driver answering): it reads what
:mod:`slurm_gpueff.node.agent` publishes. The Prolog maps each Slurm GPU index to its /dev/nvidiaN minor and
the agent's GPU of that minor, and snapshots its counters; the Epilog differences them (docs/FIGURES.md).
Nothing raises to the hook: every failure becomes ``None`` figures with a reason.

A MIG slice gets its own figures from the agent's per-GPU-instance counters, never the whole GPU's: its
Slurm index is not a /dev/nvidiaN minor, and NVML's utilization, energy and power are whole-GPU readings.
Each slice is resolved to (parent GPU, GPU instance) by :mod:`.gpu_ids`; what is measured per slice and why
the rest is n/a: docs/FIGURES.md "On the dcgm backend, and on MIG slices".
"""

from __future__ import annotations

import json
import logging
import time

from .. import statedir
from ..node import gpu_ids, integrals, tickwire
from ..node.agent_files import mig_key, read_job_timeline
from ..node.nvml_sampler import GPM_METRICS, NO_GPM_REASON
from ..record import empty_gpu
from . import window as win
from .base import NO_START, Collector, JobContext, Measurement, slurm_index_to_minor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from ..config import Config

log = logging.getLogger(__name__)

GPM_MIG_METRICS = tuple(GPM_METRICS)
# How the node agent mapped a shared GPU's processes to jobs (node/proc_jobs.py), in the card's words.
SHARE_HOW = {"cgroup": "processes mapped to jobs by their Slurm cgroup",
             "environment": "processes mapped to jobs by their SLURM_JOB_ID (owner checked)"}
WHOLE_GPU_ONLY = ("kernel_active", "energy_j", "power_mean_w")


def _no_minor(minor: int) -> str:
    return f"the gpueff agent sees no GPU with minor number {minor} (/dev/nvidia{minor})"


def _backend(gpus: list[dict[str, Any]]) -> str:
    return "nvml-gpm" if any(g["source"] == "nvml-gpm" for g in gpus) else "nvml"


class NvmlCollector(Collector):
    """Per-job figures from the gpueff node agent (NVML + GPM). Labelled ``nvml-gpm`` or ``nvml``."""

    name = "nvml"

    def __init__(self, config: Config, *, dev_dir: str | None = None, now: Callable[[], float] = time.time) -> None:
        super().__init__(config)
        self.dev_dir = dev_dir or config.collector.dev_dir
        self.now = now
        self.state_dir = config.paths.state_dir
        self.stale_s = float(config.collector.agent_stale_s)
        self.ask_agent = True  # False in peek: the agent itself calls it right after a reading

    def read_state(self) -> tuple[dict[str, Any] | None, str | None]:
        """(state, None) when usable, else (state or None, reason)."""
        path = statedir.agent_state(self.state_dir)
        try:
            with open(path, "rb") as fh:
                state = json.loads(fh.read())
        except FileNotFoundError:
            return None, f"gpueff agent not running on this node (no state file {path})"
        except (OSError, ValueError) as exc:
            return None, f"gpueff agent state {path} unreadable: {exc}"
        if not isinstance(state, dict) or not isinstance(state.get("gpus"), dict):
            return None, f"gpueff agent state {path} has an unexpected format"
        updated = state.get("updated")
        if not isinstance(updated, int | float):
            return state, f"gpueff agent state {path} has no update time"
        if state.get("stopped"):
            return state, f"gpueff agent was stopped at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(updated))}"
        age = self.now() - updated
        if age > self.stale_s:
            return state, (f"gpueff agent state is stale: last update {age:.0f} s ago "
                           f"(> collector.agent_stale_s = {self.stale_s:.0f} s); agent hung or dead?")
        return state, None

    @staticmethod
    def _by_minor(state: dict[str, Any]) -> dict[int, str]:
        return {g["minor"]: u for u, g in state["gpus"].items()
                if isinstance(g, dict) and g.get("minor") is not None}

    @staticmethod
    def _snapshot(g: dict[str, Any]) -> dict[str, Any]:
        return {k: g.get(k) for k in ("sum", "covered_s", "count", "ticks", "energy_est_mj", "energy_mj", "series",
                                      "unattributed")}

    def _read_now(self) -> tuple[dict[str, Any] | None, str | None, dict[str, Any]]:
        """Ask the agent for a reading now, then read its state: (state, why unusable, the reading's
        description for :func:`.window.job_window`). A stale or stopped agent's state is still usable:
        its counters up to its last reading are what a restarted agent resumes."""
        t = self.now()
        if self.ask_agent:
            answer, why = tickwire.request_reading(self.state_dir, float(self.config.collector.tick_wait_s))
        else:
            answer, why = None, "a live record: the agent's reading just taken"
        state, err = self.read_state()
        down = err if state is not None and isinstance(state.get("updated"), int | float) and err else None
        exact = (answer is not None and isinstance(state, dict) and state.get("updated") == answer.get("updated")) \
            or (not self.ask_agent and err is None)
        return state, (None if down else err), win.reading(t, state, exact, why, down)

    def start(self, job: JobContext) -> dict[str, Any]:
        try:
            return self._start(job)
        except Exception as exc:  # noqa: BLE001 - a hook must never fail on our account
            log.exception("nvml collector start failed")
            return {"backend": self.name, "t": self.now(), "uuids": [], "gpus": {},
                    "error": f"nvml collector failed at job start: {exc}"}

    def _start(self, job: JobContext) -> dict[str, Any]:
        state, err, rd = self._read_now()
        out: dict[str, Any] = {"backend": self.name, "t": rd["t"], "uuids": [], "gpus": {}, "error": err,
                               "reading": {k: v for k, v in rd.items() if k != "gaps"}}
        if state is not None:
            out["agent"] = {"pid": state.get("pid"), "instance": state.get("instance"),
                            "started": state.get("started")}
            out["updated"] = state.get("updated")
        if gpu_ids.job_slices(job.env):  # MIG slices: the slice's own counters, never the whole GPU's
            return _mig_start(self.state_dir, job, out, state, err)
        minors = slurm_index_to_minor(job.gpu_indexes, self.dev_dir)
        by_minor = self._by_minor(state) if state is not None else {}
        for idx in job.gpu_indexes:
            minor = minors.get(idx)
            entry: dict[str, Any] = {"minor": minor}
            if minor is None:
                entry["error"] = f"Slurm GPU index {idx} has no /dev/nvidiaN device on this node"
            elif state is not None:
                u = by_minor.get(minor)
                if u is None:
                    entry["error"] = _no_minor(minor)
                else:
                    entry["uuid"] = u
                    out["uuids"].append(u)
                    if err is None:
                        entry["snapshot"] = self._snapshot(state["gpus"][u])
                        share = (state["gpus"][u].get("shares") or {}).get(str(job.job_id))
                        entry["snapshot"]["share"] = share if isinstance(share, dict) else None
            out["gpus"][str(idx)] = entry
        return out

    def stop(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        try:
            return self._stop(job, start_state)
        except Exception as exc:  # noqa: BLE001 - a hook must never fail on our account
            log.exception("nvml collector stop failed")
            reason = f"nvml collector failed at job end: {exc}"
            return Measurement(self.name, [empty_gpu(i, self.name, reason) for i in job.gpu_indexes], reason)

    def peek(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        """The figures so far, to the agent's last reading: called by the agent right after a reading (so it
        does not ask for one), while the job's Prolog state and the agent's counters stay as they are."""
        self.ask_agent = False
        try:
            return self.stop(job, start_state)
        finally:
            self.ask_agent = True

    def _stop(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        state, err, end = self._read_now()
        reason = self._job_reason(start_state, state, err)
        if gpu_ids.job_slices(job.env):
            interval = float((state or {}).get("interval_s") or self.config.agent.interval_s)
            gpus = _mig_stop(job, start_state, state=state, reason=reason, interval_s=interval,
                             state_dir=self.state_dir, end=end)
            return Measurement(_backend(gpus), gpus, reason)
        minors = slurm_index_to_minor(job.gpu_indexes, self.dev_dir)
        by_minor = self._by_minor(state) if state is not None else {}
        gpus = []
        for idx in job.gpu_indexes:
            entry = ((start_state or {}).get("gpus") or {}).get(str(idx)) or {}
            minor = entry.get("minor", minors.get(idx))
            u = entry.get("uuid") or (by_minor.get(minor) if minor is not None else None)
            ag = state["gpus"].get(u) if (state is not None and u) else None
            ident: dict[str, Any] = {"minor": minor, "uuid": u}
            if isinstance(ag, dict):
                ident.update({k: ag.get(k) for k in ("pci_bus_id", "model", "memory_total_bytes")})
            gpu_reason = reason
            if gpu_reason is None:
                if minor is None:
                    gpu_reason = f"Slurm GPU index {idx} has no /dev/nvidiaN device on this node"
                elif entry.get("error"):
                    gpu_reason = entry["error"]
                elif ag is None:
                    gpu_reason = _no_minor(minor)
                elif not isinstance(entry.get("snapshot"), dict):
                    gpu_reason = "no counter snapshot from job start for this GPU"
            if gpu_reason is not None:
                gpus.append(empty_gpu(idx, self.name, gpu_reason, **ident))
                continue
            # No reason: _job_reason found both states, and ag is this GPU's entry.
            assert start_state is not None and state is not None and ag is not None
            w = win.job_window(_start_reading(start_state), end)
            ident.update(window_s=round(w["end"] - w["start"], 3), measured_s=round(win.measured_s(w), 3), window=w)
            why = _continuity(entry["snapshot"].get("series"), ag, w, ident["measured_s"])
            if why is not None:
                gpus.append(empty_gpu(idx, self.name, why, **ident))
                continue
            gpus.append(self._record_gpu(job, idx, ident, entry["snapshot"], ag, start_state, state))
        backend = _backend(gpus)
        if reason is None and backend == "nvml" and gpus:
            reasons = {r for g in gpus for r in [g["missing"].get("sm_active")] if r}
            reason = reasons.pop() if len(reasons) == 1 else None
        return Measurement(backend, gpus, reason)

    def _job_reason(self, start_state: dict[str, Any] | None, state: dict[str, Any] | None,
                    err: str | None) -> str | None:
        """Why no GPU of the job can be measured, or None."""
        if not isinstance(start_state, dict) or "gpus" not in start_state:
            return NO_START
        if start_state.get("error"):
            return f"at job start: {start_state['error']}"
        if err is not None or state is None:  # _read_now gives no state only with a reason
            return err if state is None else f"at job end: {err}"
        return None

    def _record_gpu(self, job: JobContext, idx: int, ident: dict[str, Any], snap: dict[str, Any], ag: dict[str, Any],
                     start_state: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
        gpm = bool(ag.get("gpm_supported"))
        gpu = empty_gpu(idx, "nvml-gpm" if gpm else "nvml", None, **ident)
        missing: dict[str, str] = {}
        interval = state.get("interval_s", self.config.agent.interval_s)
        short = f"job shorter than one sampling interval ({interval:g} s)"
        windows = {m: integrals.window(snap, ag, m) for m in integrals.METRICS}
        gpu["samples"] = samples = max(n for _mean, _cov, n in windows.values())
        for m, (mean, _cov, _n) in windows.items():
            key = "power_mean_w" if m == "power_w" else m
            if mean is not None:
                gpu[key] = round(mean, 3) if m == "power_w" else round(integrals.clamp_fraction(mean), 6)
            elif m in GPM_METRICS and not gpm:
                missing[key] = ag.get("gpm_reason") or NO_GPM_REASON
            elif samples == 0:
                missing[key] = f"{short}: no agent sample fell inside it"
            else:
                missing[key] = ("GPM returned no valid value during the job" if m in GPM_METRICS
                                else "NVML returned no value during the job")
        # Energy: difference of the cumulative counter (extended by integrated power between reads).
        e0, e1 = snap.get("energy_est_mj"), ag.get("energy_est_mj")
        if not isinstance(e0, int | float) or not isinstance(e1, int | float):
            missing["energy_j"] = f"energy counter not available ({ag.get('energy_error') or 'not supported'})"
        elif e1 < e0:
            missing["energy_j"] = "energy counter went backwards (driver reloaded?)"
        elif samples > 0 or e1 > e0:
            gpu["energy_j"] = round((e1 - e0) / 1000.0, 3)
        else:
            missing["energy_j"] = short
        # Peak memory: tracked by the agent while the job's state file existed.
        peak = ((state.get("jobs") or {}).get(str(job.job_id)) or {}).get(ident["uuid"])
        if isinstance(peak, int) and peak >= 0:
            gpu["memory_used_peak_bytes"] = peak
        else:
            missing["memory_used_peak_bytes"] = ("the agent saw no memory sample while the job's state file "
                                                 "existed (job shorter than one sampling interval?)")
        if gpm and all(gpu[m] is None for m in GPM_METRICS):
            gpu["source"] = "nvml"
        gpu["missing"] = missing
        end_share = (ag.get("shares") or {}).get(str(job.job_id))
        if isinstance(end_share, dict) and _number(end_share.get("shared_s")) > _number((snap.get("share") or {})
                                                                                       .get("shared_s")):
            _own_part(gpu, missing, snap, ag, end_share)
        elif samples > 0:
            gpu["timeline"] = read_job_timeline(self.state_dir, ident["uuid"], {"series": snap.get("series")},
                                                job.start_time, start_state, snap, state, ag)
        return gpu


def _number(v: object) -> float:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


def _own_part(gpu: dict[str, Any], missing: dict[str, str], snap: dict[str, Any], ag: dict[str, Any],
              end: dict[str, Any]) -> None:
    """The GPU was shared with other jobs during this one: its figures become the job's own part, which the
    agent attributed by processes (node/attribution.py), and ``shared`` says with whom and how. The device's
    timeline is every job's, so it is left out."""
    device_kernel = gpu.get("kernel_active")  # the whole GPU's, before it becomes the job's part
    start: dict[str, Any] = snap["share"] if isinstance(snap.get("share"), dict) else dict(integrals.new_counters())
    lost = _number(end.get("unmeasured_s")) - _number(start.get("unmeasured_s"))
    unmeasured = (str(end.get("unmeasured_why") or "this job's part could not be measured") + f" ({lost:.0f} s)"
                  if lost > 0 else None)
    for m in integrals.METRICS:
        key = "power_mean_w" if m == "power_w" else m
        if gpu.get(key) is None:
            continue  # the device did not measure it: nothing to split, its reason stands
        mean, _cov, _n = integrals.window(start, end, m)
        if mean is None or unmeasured:  # the measured rest of the window is its edges, not the job: n/a
            gpu[key] = None
            missing[key] = unmeasured or "no reading of the shared GPU fell inside the job's part of it"
        else:
            gpu[key] = round(mean, 3) if m == "power_w" else round(integrals.clamp_fraction(mean), 6)
    if gpu.get("energy_j") is not None and unmeasured:
        gpu["energy_j"] = None  # a part of the window's energy is nobody's to give: no sum is this job's
        missing["energy_j"] = unmeasured
    elif gpu.get("energy_j") is not None:
        gpu["energy_j"] = round(max(0.0, _number(end.get("energy_mj")) - _number(start.get("energy_mj"))) / 1000.0, 3)
    peak = end.get("memory_peak_bytes")
    gpu["memory_used_peak_bytes"] = peak if isinstance(peak, int) and not isinstance(peak, bool) else None
    if gpu["memory_used_peak_bytes"] is None:
        missing["memory_used_peak_bytes"] = "NVML listed none of this job's processes on the shared GPU"
    tracked = _number(end.get("tracked_s")) - _number(start.get("tracked_s"))
    held = _number(end.get("held_s")) - _number(start.get("held_s"))
    un0: dict[str, Any] = (snap["unattributed"] if isinstance(snap.get("unattributed"), dict)
                           else dict(integrals.new_counters()))
    un1 = ag.get("unattributed") if isinstance(ag.get("unattributed"), dict) else None
    stray, _cov, _n = integrals.window(un0, un1, "kernel_active") if un1 is not None else (None, 0.0, 0)
    how = [h for h in end.get("how") or [] if h in SHARE_HOW]
    others = [str(j) for j in end.get("with") or [] if isinstance(j, str)]
    gpu["shared"] = {
        "with": others[:64], "with_count": max(len(others), int(_number(end.get("with_count")))),
        "method": "split by NVML's per-process SM utilization, " + (
            " and ".join(SHARE_HOW[h] for h in sorted(how)) if how else "none of this job's processes was found"),
        "share": round(min(1.0, held / tracked), 6) if tracked > 0 else None,
        "shared_s": round(_number(end.get("shared_s")) - _number(start.get("shared_s")), 3),
        "unmeasured_s": round(max(lost, 0.0), 3),
        "unattributed": round(integrals.clamp_fraction(stray), 6) if stray is not None else None,
        "gpu_kernel_active": device_kernel}


def _start_reading(start_state: dict[str, Any]) -> dict[str, Any]:
    """The Prolog's reading description (a Prolog state from before readings on request: its last one)."""
    rd = start_state.get("reading")
    if isinstance(rd, dict) and isinstance(rd.get("t"), int | float):
        return rd
    updated = start_state.get("updated")
    live = isinstance(updated, int | float)
    return {"t": start_state.get("t") if isinstance(start_state.get("t"), int | float) else updated,
            "updated": updated, "live": live, "exact": False}


def _continuity(series: object, ag: dict[str, Any], w: dict[str, Any], measured: float) -> str | None:
    """Why the counters cannot be differenced over the window ``w`` (noted in it), or None."""
    if series != ag.get("series"):
        w["break"] = f"measurement continuity lost during the job: {ag.get('series_why') or 'counters restarted'}"
        return str(w["break"])
    if measured <= 0 and w["gaps"]:
        return f"the gpueff agent was down for the whole job ({w['gaps'][0][2]})"
    return None


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


def _slice_snapshot(sl: dict[str, Any]) -> dict[str, Any]:
    return {k: sl.get(k) for k in ("sum", "covered_s", "count", "ticks", "gen")} | {
        "n_ci": len(sl.get("devices") or {})}


def _mig_start(state_dir: str, job: JobContext, out: dict[str, Any], state: dict[str, Any] | None,
               err: str | None) -> dict[str, Any]:
    """Complete ``out``, the Prolog state (``state``/``err`` from NvmlCollector.read_state): each slice
    resolved while it exists, its counters snapshotted, its UUID in ``uuids`` for the agent's peak memory."""
    inventory = (state.get("mig") if isinstance(state, dict) else None) or gpu_ids.agent_inventory(state_dir)
    out["mig"] = {}
    for idx, mig_uuid in gpu_ids.job_slices(job.env):
        desc, why = gpu_ids.resolve(mig_uuid, inventory if isinstance(inventory, dict) else {}, gpu_ids.nvml_lookup)
        entry: dict[str, Any] = {"uuid": mig_uuid, "desc": desc, "error": why}
        out["uuids"].append(mig_uuid)
        if desc is not None and err is None and isinstance(state, dict):
            sl = _slice_entry(state, desc)
            if sl is None:
                entry["slice_error"] = _not_seen(state, desc)
            else:
                entry["snapshot"] = _slice_snapshot(sl)
        out["mig"][str(idx)] = entry
    return out


def _mig_stop(job: JobContext, start_state: dict[str, Any] | None, *, state: dict[str, Any] | None,
              reason: str | None, interval_s: float, state_dir: str, end: dict[str, Any]) -> list[dict[str, Any]]:
    """One record entry per slice: identity from the Prolog's state (or the agent's inventory), figures
    from the difference of the slice's counters; ``reason`` (agent down, restarted, no Prolog state) voids them."""
    saved = (start_state or {}).get("mig") or {}
    gpus = []
    for idx, mig_uuid in gpu_ids.job_slices(job.env):
        entry = saved.get(str(idx)) or {}
        desc, why = entry.get("desc"), entry.get("error")
        if desc is None and why is None:
            inventory = state.get("mig") if isinstance(state, dict) else None
            desc, why = gpu_ids.resolve(mig_uuid, inventory if isinstance(inventory, dict) else None, None)
        gpu = empty_gpu(idx, "nvml", why, **gpu_ids.slice_ident(desc, mig_uuid))
        gpus.append(gpu)
        if why:
            continue
        assert desc is not None  # a slice without a reason was resolved
        missing: dict[str, str] = {m: gpu_ids.KERNEL_MIG_REASON if m == "kernel_active" else gpu_ids.ENERGY_MIG_REASON
                                   for m in WHOLE_GPU_ONLY}
        gpu["missing"] = missing
        slice_reason = reason or _slice_reason(entry, state, desc)
        if slice_reason:
            missing.update(dict.fromkeys((*GPM_MIG_METRICS, "memory_used_peak_bytes"), slice_reason))
        else:  # counters to difference: a Prolog snapshot (so a start state) and the slice at job end
            assert start_state is not None and state is not None
            w = win.job_window(_start_reading(start_state), end)
            gpu.update(window_s=round(w["end"] - w["start"], 3), measured_s=round(win.measured_s(w), 3), window=w)
            _slice_figures(job, gpu, missing, entry, mig_uuid, desc, start_state, state, interval_s, state_dir)
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


def _slice_figures(job: JobContext, gpu: dict[str, Any], missing: dict[str, str], entry: dict[str, Any],
                   mig_uuid: str, desc: dict[str, Any], start_state: dict[str, Any], state: dict[str, Any],
                   interval_s: float, state_dir: str) -> None:
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
            missing[m] = end.get("gpm_reason") or gpu_ids.NO_GPM_MIG_REASON
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

