"""The dcgm backend: DCGM job statistics and profiling fields per allocation, through nv-hostengine.

The Prolog makes a DCGM group of exactly the job's GPUs (found by UUID, never by ordinal: :mod:`.gpu_ids`)
or MIG GPU instances, watches the fields and starts job stats; the Epilog reads and removes it all. What
each figure is: docs/FIGURES.md "On the dcgm backend". Profiling fields are named by numeric id (DCGM 4.6
renamed their symbols). Failures never fail the hook: they fall back to the gpueff agent's counters
(snapshotted at job start for this reason) or to allocation only, with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time

from .. import spool, statedir
from ..node import gpu_ids
from ..node.agent_files import read_state
from ..node.gpu_ids import PROC_GPUS, job_slices, normalize_bus_id, proc_gpus
from ..record import METRICS, empty_gpu
from . import dcgm_bindings as dcgmb
from .base import NO_START, Collector, JobContext, Measurement, NoneCollector, slurm_index_to_minor
from .dcgm_bindings import fp64, handle, handle_int, i32, i64

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator
    from typing import Any, TypeVar

    from ..config import Config
    from .dcgm_bindings import Bindings, GpuJobStats
    from .nvml import NvmlCollector

    _T = TypeVar("_T")

log = logging.getLogger(__name__)

# Profiling field id -> record metric (values are ratios 0-1).
PROF_FIELDS: dict[int, str] = {1002: "sm_active", 1003: "sm_occupancy", 1004: "tensor_active",
                               1005: "dram_active", 1006: "fp64_active", 1007: "fp32_active",
                               1008: "fp16_active", 1013: "imma_active", 1014: "hmma_active", 1015: "dfma_active"}
# What to retry with when a GPU cannot watch every field in one pass (PROFILING_MULTI_PASS, pre-Hopper);
# the dropped fields are None with the reason.
PROF_FALLBACKS: tuple[tuple[int, ...], ...] = (tuple(PROF_FIELDS), (1002, 1003, 1004, 1005), (1002,))
JOBSTATS_METRICS = ("kernel_active", "energy_j", "power_mean_w", "memory_used_peak_bytes")
# record key of throttle_s -> field of DCGM's per-GPU job stats (microseconds).
VIOLATIONS = {"power": "powerViolationTime", "thermal": "thermalViolationTime",
              "reliability": "reliabilityViolationTime", "board_limit": "boardLimitViolationTime",
              "low_utilization": "lowUtilizationTime", "sync_boost": "syncBoostTime"}

BLANK_REASON = "DCGM returned a blank value (not supported or not recorded on this GPU)"
NO_SAMPLES = "DCGM has no samples of this field in the job's window (job shorter than dcgm.update_interval_s?)"


class DcgmCollector(Collector):
    """DCGM through nv-hostengine; falls back to the gpueff agent (nvml) or allocation-only."""

    name = "dcgm"

    def __init__(self, config: Config, *, proc_dir: str = PROC_GPUS, dev_dir: str | None = None,
                 now: Callable[[], float] = time.time,
                 mig_lookup: Callable[[str], dict[str, Any]] | None = gpu_ids.nvml_lookup) -> None:
        super().__init__(config)
        self.proc_dir = proc_dir
        self.dev_dir = dev_dir or config.collector.dev_dir
        self.now = now
        self.mig_lookup = mig_lookup
        self.dc = config.dcgm

    def _nvml(self) -> NvmlCollector:
        from .nvml import NvmlCollector

        return NvmlCollector(self.config, dev_dir=self.dev_dir)

    def _fallback(self, wanted: bool = False) -> NvmlCollector | None:
        """The nvml collector when the gpueff agent publishes on this node (or was used at start)."""
        if wanted or os.path.exists(statedir.agent_state(self.config.paths.state_dir)):
            return self._nvml()
        return None

    def _with_dcgm(self, fn: Callable[[Bindings, object], _T]) -> _T:
        why = dcgmb.probe(self.dc.hostengine, self.dc.connect_timeout_s)
        if why is not None:
            raise dcgmb.DcgmUnavailable(why)
        b = dcgmb.import_bindings(self.dc.bindings_path)
        try:
            h = dcgmb.connect(b, self.dc.hostengine, self.dc.connect_timeout_s)
        except Exception as exc:  # noqa: BLE001 - DCGMError or library load failure
            raise dcgmb.DcgmUnavailable(f"cannot connect to nv-hostengine at {self.dc.hostengine}: "
                                        f"{dcgmb.describe(exc)}") from None
        try:
            return fn(b, h)
        finally:
            dcgmb.disconnect(b, h)

    def start(self, job: JobContext) -> dict[str, Any]:
        state: dict[str, Any] = {"backend": self.name, "t": self.now()}
        fb = self._fallback()
        if fb is not None:  # its start never raises: every failure is in its state's "error"
            state.update({k: v for k, v in fb.start(job).items() if k not in ("backend", "t")})
            state["fallback"] = fb.name
        try:
            state["dcgm"] = self._with_dcgm(lambda b, h: self._dcgm_start(job, b, h))
        except Exception as exc:  # noqa: BLE001 - every DCGM failure becomes a reason
            state["dcgm_error"] = f"DCGM unavailable at job start: {dcgmb.describe(exc)}"
            log.warning("job %s: %s", job.job_id, state["dcgm_error"])
        if self.dc.exporter_mapping:
            state["exporter"] = self._exporter_add(job, state)
        return state

    def _dcgm_gpus(self, b: Bindings, h: object) -> list[dict[str, Any]]:
        out = []
        for gid in b.agent.dcgmGetAllSupportedDevices(h):
            attrs = b.agent.dcgmGetDeviceAttributes(h, gid)
            ident = attrs.identifiers
            mem_mb = i64(getattr(attrs.memoryUsage, "fbTotal", None))
            out.append({"gpu_id": int(gid), "uuid": str(ident.uuid) or None,
                        "pci_bus_id": normalize_bus_id(str(ident.pciBusId)),
                        "model": str(ident.deviceName) or None,
                        "memory_total_bytes": mem_mb * 1024 * 1024 if mem_mb else None})
        return out

    def _agent_minors(self) -> dict[int, dict[str, Any]]:
        gpus = read_state(self.config.paths.state_dir).get("gpus") or {}
        return {g["minor"]: {"uuid": u, "pci_bus_id": normalize_bus_id(g.get("pci_bus_id")), "index": g.get("index")}
                for u, g in gpus.items() if isinstance(g, dict) and isinstance(g.get("minor"), int)}

    def _gpu_targets(self, job: JobContext, dcgm_gpus: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        minors = slurm_index_to_minor(job.gpu_indexes, self.dev_dir)
        procs = proc_gpus(self.proc_dir)
        agent = self._agent_minors()
        by_uuid = {g["uuid"]: g for g in dcgm_gpus if g["uuid"]}
        by_bus = {g["pci_bus_id"]: g for g in dcgm_gpus if g["pci_bus_id"]}
        targets = {}
        for idx in job.gpu_indexes:
            minor = minors.get(idx)
            t: dict[str, Any] = {"minor": minor, "entity_group": 1}  # DCGM_FE_GPU
            known = procs.get(minor) or agent.get(minor) if minor is not None else None
            if minor is None:
                t["error"] = f"Slurm GPU index {idx} has no /dev/nvidiaN device on this node"
            elif not known:
                t["error"] = (f"cannot identify /dev/nvidia{minor}: no {self.proc_dir}/*/information entry "
                              "with that minor and no gpueff agent state")
            else:
                g = by_uuid.get(known.get("uuid")) or by_bus.get(known.get("pci_bus_id"))
                if g is None:
                    t["error"] = (f"DCGM does not list the GPU at /dev/nvidia{minor} "
                                  f"({known.get('uuid') or known.get('pci_bus_id')})")
                    t.update({"uuid": known.get("uuid"), "pci_bus_id": known.get("pci_bus_id")})
                else:
                    t.update({k: g[k] for k in ("gpu_id", "uuid", "pci_bus_id", "model", "memory_total_bytes")})
                    t["entity_id"] = g["gpu_id"]
            targets[str(idx)] = t
        return targets

    def _mig_targets(self, slices: list[tuple[int, str]], b: Bindings, h: object,
                     dcgm_gpus: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
        inventory = gpu_ids.agent_inventory(self.config.paths.state_dir)
        by_uuid = {g["uuid"]: g for g in dcgm_gpus if g["uuid"]}
        fe_gpu_i = int(getattr(b.fields, "DCGM_FE_GPU_I", 4))
        hierarchy = b.agent.dcgmGetGpuInstanceHierarchy(h)
        entities = list(hierarchy.entityList[: int(hierarchy.count)])
        targets = {}
        for idx, mig_uuid in slices:
            desc, why = gpu_ids.resolve(mig_uuid, inventory, self.mig_lookup)
            t: dict[str, Any] = {"entity_group": fe_gpu_i, **gpu_ids.slice_ident(desc, mig_uuid)}
            parent = by_uuid.get(t["uuid"]) if desc else None
            if why:
                t["error"] = why
            elif parent is None:
                t["error"] = f"DCGM does not list the parent GPU {t['uuid']} of MIG device {mig_uuid}"
            else:
                t.update({k: parent[k] for k in ("gpu_id", "model", "pci_bus_id")})
                for e in entities:
                    if (int(e.entity.entityGroupId) == fe_gpu_i and int(e.parent.entityId) == parent["gpu_id"]
                            and int(e.info.nvmlInstanceId) == t["mig_gi_id"]):
                        t["entity_id"] = int(e.entity.entityId)
                        break
                else:
                    t["error"] = (f"DCGM has no GPU instance {t['mig_gi_id']} on GPU {parent['gpu_id']} "
                                  f"for MIG device {mig_uuid}")
            targets[str(idx)] = t
        return targets

    def _keep_age(self, job: JobContext) -> float:
        """Seconds DCGM keeps the job's samples: the configured age, or longer if the job may run longer."""
        keep = float(self.dc.keep_age_s)
        end = job.env.get("SLURM_JOB_END_TIME", "")
        if end.isascii() and end.isdigit():
            keep = max(keep, float(end) - self.now() + 3600.0)
        return keep

    def _dcgm_start(self, job: JobContext, b: Bindings, h: object) -> dict[str, Any]:
        slices = job_slices(job.env)
        dcgm_gpus = self._dcgm_gpus(b, h)
        targets = self._mig_targets(slices, b, h, dcgm_gpus) if slices else self._gpu_targets(job, dcgm_gpus)
        members = [t for t in targets.values() if "entity_id" in t]
        if not members:
            errors = "; ".join(sorted({t.get("error") or "?" for t in targets.values()})) or "job has no GPUs"
            raise dcgmb.DcgmUnavailable(f"none of the job's GPUs could be found in DCGM ({errors})")
        key = f"gpueff-{job.job_id}"
        stamp = f"{key}-{int(self.now())}"
        gid = handle_int(b.agent.dcgmGroupCreate(h, int(getattr(b.structs, "DCGM_GROUP_EMPTY", 1)), stamp))
        out: dict[str, Any] = {"key": key, "group_id": gid, "field_group_id": None, "prof_fields": [],
                               "prof_reason": None, "jobstats": not slices, "t0_us": int(self.now() * 1e6),
                               "targets": targets, "notes": []}
        try:
            for t in members:
                if t["entity_group"] == 1:
                    b.agent.dcgmGroupAddDevice(h, handle(gid), t["entity_id"])
                else:
                    b.agent.dcgmGroupAddEntity(h, handle(gid), t["entity_group"], t["entity_id"])
            keep = self._keep_age(job)
            freq_us = int(float(self.dc.update_interval_s) * 1e6)
            if out["jobstats"]:
                b.agent.dcgmWatchJobFields(h, handle(gid), freq_us, keep, 0)
                self._job_start(b, h, gid, key, out)
            if self.dc.profiling:
                self._watch_prof(b, h, gid, stamp, freq_us, keep, out)
            else:
                out["prof_reason"] = "profiling fields disabled (dcgm.profiling = false)"
        except BaseException:
            self._cleanup(b, h, out)
            raise
        return out

    def _job_start(self, b: Bindings, h: object, gid: int, key: str, out: dict[str, Any]) -> None:
        try:
            b.agent.dcgmJobStartStats(h, handle(gid), key)
        except Exception as exc:  # noqa: BLE001
            if dcgmb.status(exc) != dcgmb.ST_DUPLICATE_KEY:
                raise
            # A job of the same id is still registered: the job was requeued and its earlier Epilog
            # never ran. The key carries our prefix, so the stale entry is ours to drop.
            try:
                b.agent.dcgmJobRemove(h, key)
                b.agent.dcgmJobStartStats(h, handle(gid), key)
            except Exception as again:  # noqa: BLE001
                raise dcgmb.DcgmUnavailable(f"{dcgmb.describe(exc)}; removing the stale DCGM job {key} did not "
                                            f"help ({dcgmb.describe(again)})") from None
            out["notes"].append("a stale DCGM job with this id was removed (job requeued?)")

    def _watch_prof(self, b: Bindings, h: object, gid: int, stamp: str, freq_us: int, keep: float,
                    out: dict[str, Any]) -> None:
        dropped_why = None
        for attempt, ids in enumerate(PROF_FALLBACKS):
            fg = handle_int(b.agent.dcgmFieldGroupCreate(h, list(ids), f"{stamp}-prof{attempt}"))
            try:
                b.agent.dcgmWatchFields(h, handle(gid), handle(fg), freq_us, keep, 0)
            except Exception as exc:  # noqa: BLE001
                with contextlib.suppress(Exception):
                    b.agent.dcgmFieldGroupDestroy(h, handle(fg))
                if dcgmb.status(exc) == dcgmb.ST_PROFILING_MULTI_PASS:
                    dropped_why = ("DCGM cannot collect this profiling field together with the others on "
                                   "this GPU (PROFILING_MULTI_PASS, pre-Hopper)")
                    continue
                out["prof_reason"] = f"DCGM profiling fields not available: {dcgmb.describe(exc)}"
                return
            out["field_group_id"] = fg
            out["prof_fields"] = list(ids)
            if dropped_why and len(ids) < len(PROF_FIELDS):
                out["prof_dropped"] = {PROF_FIELDS[f]: dropped_why for f in PROF_FIELDS if f not in ids}
            return
        out["prof_reason"] = f"DCGM profiling fields not available: {dropped_why}"

    def stop(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        st = start_state if isinstance(start_state, dict) else {}
        try:
            if ex := st.get("exporter"):
                unmap_job(ex["dir"], ex.get("gpu_ids") or [], str(ex.get("job") or job.job_id))
        except Exception as exc:  # noqa: BLE001
            log.warning("job %s: cannot remove dcgm-exporter job mapping: %s", job.job_id, exc)
        d = st.get("dcgm")
        if st.get("backend") in ("nvml", "nvml-gpm") and "gpus" in st:
            return self._nvml().stop(job, st)  # the Prolog ran another backend (auto chose nvml then): finish it
        if not isinstance(d, dict):
            why = st.get("dcgm_error") or (NO_START if not st else "DCGM was not used at job start")
            return self._fall_back(job, st, why)
        try:
            gpus, reason = self._with_dcgm(lambda b, h: self._dcgm_stop(job, d, b, h))
        except Exception as exc:  # noqa: BLE001
            return self._fall_back(job, st, f"DCGM failed at job end: {dcgmb.describe(exc)}")
        return Measurement(self.name, gpus, reason)

    def _fall_back(self, job: JobContext, st: dict[str, Any], why: str) -> Measurement:
        fb = self._fallback(wanted=st.get("fallback") == "nvml")
        if fb is None:
            return NoneCollector(self.config, f"{why}; no gpueff agent on this node to fall back to").stop(job, None)
        meas = fb.stop(job, st if "gpus" in st else None)
        meas.reason = f"{why}; figures from the gpueff agent (nvml) instead" + (
            f"; {meas.reason}" if meas.reason else "")
        return meas

    def _dcgm_stop(self, job: JobContext, d: dict[str, Any], b: Bindings,
                   h: object) -> tuple[list[dict[str, Any]], str | None]:
        key = d["key"]
        t1_us = int(self.now() * 1e6)
        try:
            per_gpu: dict[int, GpuJobStats] = {}
            if d.get("jobstats"):
                b.agent.dcgmJobStopStats(h, key)
                stats = b.agent.dcgmJobGetStats(h, key)
                per_gpu = {int(g.gpuId): g for g in stats.gpus[: max(0, int(stats.numGpus))]}
            gpus = [self._gpu_record(b, h, int(idx), t, d, per_gpu, t1_us)
                    for idx, t in sorted(d["targets"].items(), key=lambda kv: int(kv[0]))]
        finally:
            self._cleanup(b, h, d)
        notes = list(d.get("notes") or [])
        reasons = {r for g in gpus for r in [g["missing"].get("sm_active")] if r}
        if len(reasons) == 1 and all(g["sm_active"] is None for g in gpus):
            notes.append(reasons.pop())
        return gpus, "; ".join(notes) or None

    def _gpu_record(self, b: Bindings, h: object, idx: int, t: dict[str, Any], d: dict[str, Any],
                    per_gpu: dict[int, GpuJobStats], t1_us: int) -> dict[str, Any]:
        ident = {k: t.get(k) for k in ("minor", "uuid", "pci_bus_id", "model", "memory_total_bytes")}
        if t.get("mig_uuid"):
            ident.update({k: t.get(k) for k in ("mig_uuid", "mig_gi_id", "mig_ci_id", "mig_profile")})
        if "entity_id" not in t:
            return empty_gpu(idx, self.name, t.get("error") or "GPU not found in DCGM", **ident)
        gpu = empty_gpu(idx, self.name, None, **ident)
        missing: dict[str, str] = {}
        if t.get("mig_uuid"):
            missing.update(dict.fromkeys(JOBSTATS_METRICS, gpu_ids.JOBSTATS_REASON))
        else:
            self._fill_jobstats(gpu, missing, per_gpu.get(int(t["gpu_id"])))
        gpu["samples"] = self._fill_prof(b, h, gpu, missing, t, d, t1_us)
        for m in METRICS:
            if gpu[m] is None and m not in missing:
                missing[m] = "not measured"
        gpu["missing"] = missing
        return gpu

    @staticmethod
    def _fill_jobstats(gpu: dict[str, Any], missing: dict[str, str], g: GpuJobStats | None) -> None:
        if g is None:
            missing.update(dict.fromkeys(JOBSTATS_METRICS, "DCGM job statistics have no entry for this GPU"))
            return
        util = i32(g.smUtilization.average)  # util.gpu, i.e. kernel activity (NVIDIA/DCGM#305)
        energy_mj = i64(g.energyConsumed)
        power_w = fp64(g.powerUsage.average)
        gpu["kernel_active"] = round(min(100, util) / 100.0, 6) if util is not None else None
        gpu["energy_j"] = round(energy_mj / 1000.0, 3) if energy_mj is not None else None
        gpu["power_mean_w"] = round(power_w, 3) if power_w is not None else None
        gpu["memory_used_peak_bytes"] = i64(g.maxGpuMemoryUsed)
        gpu["xid_errors"] = i32(g.numXidCriticalErrors)
        throttle_us = {k: i64(getattr(g, attr, None)) for k, attr in VIOLATIONS.items()}
        gpu["throttle_s"] = {k: round(us / 1e6, 3) for k, us in throttle_us.items() if us is not None} or None
        n = i32(g.numComputePids) or 0
        gpu["processes"] = sorted({int(p.pid) for p in g.computePids[: min(n, len(g.computePids))] if int(p.pid) > 0})
        for k in (*JOBSTATS_METRICS, "xid_errors", "throttle_s"):
            if gpu[k] is None:
                missing[k] = BLANK_REASON

    def _fill_prof(self, b: Bindings, h: object, gpu: dict[str, Any], missing: dict[str, str], t: dict[str, Any],
                   d: dict[str, Any], t1_us: int) -> int:
        fields = d.get("prof_fields") or []
        for f, m in PROF_FIELDS.items():
            if f not in fields:
                missing[m] = (d.get("prof_dropped") or {}).get(m) or d.get("prof_reason") or "not watched"
        avg_mask = int(getattr(b.structs, "DCGM_SUMMARY_AVG", 4))
        count_mask = int(getattr(b.structs, "DCGM_SUMMARY_COUNT", 0x10))
        samples = 0
        for f in fields:
            m = PROF_FIELDS[f]
            try:
                req = b.agent.dcgmGetFieldSummary(h, f, t["entity_group"], t["entity_id"], avg_mask,
                                                  d["t0_us"], t1_us)
                avg = fp64(req.response.values[0].dbl)
                cnt = b.agent.dcgmGetFieldSummary(h, f, t["entity_group"], t["entity_id"], count_mask,
                                                  d["t0_us"], t1_us)
                n = i64(cnt.response.values[0].i64)
            except Exception as exc:  # noqa: BLE001
                code = dcgmb.status(exc)
                missing[m] = NO_SAMPLES if code == dcgmb.ST_NO_DATA else f"DCGM summary failed: {dcgmb.describe(exc)}"
                continue
            if avg is None:
                missing[m] = BLANK_REASON
                continue
            gpu[m] = round(min(1.0, avg), 6)
            samples = max(samples, n or 0)
        return samples

    def _cleanup(self, b: Bindings, h: object, d: dict[str, Any]) -> None:
        """Remove the job, the watches and the group; each step on its own (one failing must not stop the rest)."""
        gid = d.get("group_id")
        fg = d.get("field_group_id")
        steps: list[tuple[str, Callable[[], object]]] = []
        if d.get("jobstats"):
            steps.append(("job remove", lambda: b.agent.dcgmJobRemove(h, d["key"])))
        if fg is not None and gid is not None:
            steps.append(("unwatch", lambda: b.agent.dcgmUnwatchFields(h, handle(gid), handle(fg))))
            steps.append(("field group destroy", lambda: b.agent.dcgmFieldGroupDestroy(h, handle(fg))))
        if gid is not None:
            steps.append(("group destroy", lambda: b.agent.dcgmGroupDestroy(h, handle(gid))))
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001
                log.warning("DCGM cleanup (%s) for %s failed: %s", what, d.get("key"), dcgmb.describe(exc))

    def _exporter_add(self, job: JobContext, state: dict[str, Any]) -> dict[str, Any]:
        """Write the mapping files; DCGM gpu ids when known, else the agent's NVML index (DCGM numbers
        GPUs in NVML order). MIG slices are skipped: the exporter labels whole GPUs only."""
        directory = self.dc.exporter_mapping_dir
        ids: list[int] = []
        d = state.get("dcgm")
        if isinstance(d, dict):
            ids = [int(t["gpu_id"]) for t in d["targets"].values()
                   if t.get("gpu_id") is not None and not t.get("mig_uuid")]
        elif not job_slices(job.env):
            minors = slurm_index_to_minor(job.gpu_indexes, self.dev_dir)
            agent = self._agent_minors()
            ids = [int(agent[m]["index"]) for m in minors.values()
                   if m is not None and m in agent and isinstance(agent[m].get("index"), int)]
        out: dict[str, Any] = {"dir": directory, "gpu_ids": ids, "job": str(job.job_id)}
        try:
            map_job(directory, ids, str(job.job_id))
        except OSError as exc:
            out["error"] = str(exc)
            log.warning("job %s: cannot write dcgm-exporter job mapping in %s: %s", job.job_id, directory, exc)
        return out


# dcgm-exporter's HPC job mapping (``dcgm.exporter_mapping``): ``DIR/<DCGM gpu id>`` lists the jobs on that GPU.
# Each change is read-modify-write under an exclusive ``flock`` (two hooks may run at once) and lands with an
# atomic rename, so the exporter never reads a half file.
EXPORTER_LOCK = ".gpueff.lock"


def _mapped_jobs(path: str) -> list[str]:
    try:
        with open(path) as fh:
            return [ln.strip() for ln in fh if ln.strip()]
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def _map_locked(directory: str) -> Iterator[None]:
    """Hold an exclusive flock on the directory's lock file (closing the file releases it)."""
    fd = os.open(os.path.join(directory, EXPORTER_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def map_job(directory: str, gpus: Iterable[int], job_id: str) -> None:
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with _map_locked(directory):
        for gid in sorted({int(g) for g in gpus}):
            path = os.path.join(directory, str(gid))
            ids = _mapped_jobs(path)
            if job_id not in ids:
                ids.append(job_id)
            spool.atomic_write(path, ("\n".join(ids) + "\n").encode(), mode=0o644)


def unmap_job(directory: str, gpus: Iterable[int], job_id: str) -> None:
    """Take ``job_id`` out of the file of each GPU id, deleting emptied files."""
    if not os.path.isdir(directory):
        return
    with _map_locked(directory):
        for gid in sorted({int(g) for g in gpus}):
            path = os.path.join(directory, str(gid))
            ids = _mapped_jobs(path)
            if job_id not in ids:
                continue
            rest = [i for i in ids if i != job_id]
            if rest:
                spool.atomic_write(path, ("\n".join(rest) + "\n").encode(), mode=0o644)
            else:
                os.unlink(path)
