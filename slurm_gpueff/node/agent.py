"""The node agent of the nvml backend: sample every GPU every few seconds, publish cumulative integrals.

A Prolog/Epilog pair runs only at a job's two ends, so the agent samples all through and publishes per
GPU (and per MIG GPU instance) cumulative integrals in ``agent/state.json`` and timeline files, which the
hooks difference (:mod:`slurm_gpueff.collectors.nvml`; docs/DESIGN.md "Data flow", docs/FIGURES.md). A hook
can ask for a reading at once (:mod:`slurm_gpueff.node.tickwire`), so a job's window runs from its Prolog
to its Epilog; a restarted agent resumes its counters (:mod:`.resume`). Of jobs it knows only their peak
memory and who runs them (for the per-job /metrics, :mod:`.job_metrics`), while a Prolog's
``jobs/<job_id>.json`` exists (:mod:`slurm_gpueff.jobstate`). The energy counter is NVML's slowest call:
read every ``ENERGY_INTERVAL_S`` and at every requested reading, extended in between by the power integral;
GPM samples are turned into figures at the same pace (and at every reading of a GPU that jobs share), since
that is NVML's other costly call (:mod:`slurm_gpueff.node.nvml_sampler`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import uuid as uuidlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .. import jobstate, spool, statedir
from . import attribution, integrals, resume
from .agent_files import line_time, mig_key
from .attribution import UNATTRIBUTED, JobShare
from .gpu_ids import parse_legacy_mig
from .job_metrics import GpuNow, JobFile, JobPart, job_series, read_job_file
from .nvml_sampler import (
    GPM_METRICS,
    NO_GPM_REASON,
    GpuInfo,
    GpuSample,
    MigInfo,
    MigSample,
    ProcSample,
    Sampler,
)
from .proc_jobs import ProcessJobs

if TYPE_CHECKING:

    from prometheus_client.metrics_core import Metric

    from ..config import Config
    from .integrals import Counters

log = logging.getLogger("slurm_gpueff.agent")

STATE_VERSION = 2
ENERGY_INTERVAL_S = 30.0
# A kernel/power reading stands for the interval before it; across a gap longer than this many
# intervals (agent stalled, host suspended) we do not pretend to know what happened.
GAP_INTERVALS = 3.0
PRUNE_EVERY_S = 3600.0
IDLE_KERNEL = 0.001  # a shared GPU whose kernels ran at most this part of the time since the last split is idle
LABELS = ("minor", "uuid", "model")  # of the /metrics series
ACTIVITIES = ("kernel_active", *GPM_METRICS)  # fractions 0-1 in the agent's ``last`` readings


class _Series:
    """What a GPU and a MIG GPU instance both carry: their integrals and their latest reading."""

    def __init__(self) -> None:
        self.counters = integrals.new_counters()
        self.ticks = 0
        self.memory_used: int | None = None
        self.last: dict[str, float | None] = {}
        self.errors: dict[str, str] = {}

    def published(self) -> dict[str, Any]:
        return {**integrals.published(self.counters, integrals.METRICS), "ticks": self.ticks,
                "memory_used_bytes": self.memory_used, "last": {m: _r(v) for m, v in self.last.items()},
                "errors": self.errors}


class _Slice(_Series):
    """The agent's running state for one GPU instance (MIG slice) of a GPU in MIG mode."""

    def __init__(self, gi_id: int, devices: list[MigInfo], since: float):
        super().__init__()
        self.gi_id = gi_id
        self.devices = devices
        self.key = frozenset(d.uuid for d in devices)
        self.gen = uuidlib.uuid4().hex[:12]  # new for every (re)created GPU instance: its counters restart
        self.since = since
        self.seen = False
        self.gpm_reason: str | None = None

    def published(self) -> dict[str, Any]:
        d0 = self.devices[0]
        return {"gi_id": self.gi_id, "gen": self.gen, "since": self.since, "profile": d0.profile,
                "memory_total_bytes": d0.memory_total_bytes, "devices": {d.uuid: d.ci_id for d in self.devices},
                "gpm_supported": self.gpm_reason is None, "gpm_reason": self.gpm_reason, **super().published()}


class _Gpu(_Series):
    def __init__(self, info: GpuInfo, why: str, since: float):
        super().__init__()
        self.info = info
        self.series, self.series_since, self.series_why = resume.new_series(), since, why
        self.mig_prev: dict[str, Any] = {}  # an earlier agent's slices (GPU instance id -> published), to resume
        self.last_t: float | None = None
        self.energy_mj: int | None = None
        self.energy_read_at: float | None = None
        self.power_since_energy_mj = 0.0
        self.energy_error: str | None = None
        self.mig: dict[int, _Slice] = {}  # GPU instance id -> slice (MIG mode only)
        self._new_shares()

    def _new_shares(self) -> None:
        """Who holds the GPU and their part of it (:mod:`.attribution`), from the current counters on."""
        self.shares: dict[str, JobShare] = {}  # job id -> its part, while its Prolog's job file names this GPU
        self.unattributed = integrals.new_counters()
        self.unattributed_energy_mj = 0.0
        self.unmapped: dict[int, str] = {}  # at the last split: pid -> why it is no running job's
        self.parts: dict[str, JobPart] = {}  # at the last split of a shared GPU: each job's part (per-job /metrics)
        self.share_error: str | None = None
        self.base = attribution.delta(self.counters, integrals.new_counters())  # a copy, to difference
        self.base_t = self.last_t
        self.base_energy = self.energy_est_mj()

    def published(self) -> dict[str, Any]:
        i = self.info
        out = {"index": i.index, "minor": i.minor, "pci_bus_id": i.pci_bus_id, "model": i.model,
               "memory_total_bytes": i.memory_total_bytes, "gpm_supported": i.gpm_supported,
               "gpm_reason": None if i.gpm_supported else (i.gpm_reason or NO_GPM_REASON),
               "gpm_metrics": sorted(GPM_METRICS) if i.gpm_supported else [], **super().published(),
               "energy_mj": self.energy_mj, "energy_read_at": self.energy_read_at,
               "energy_est_mj": _r(self.energy_est_mj()), "energy_error": self.energy_error,
               "mig_enabled": i.mig_enabled, "series": self.series, "series_since": self.series_since,
               "series_why": self.series_why,
               "shares": {j: js.published() for j, js in self.shares.items()},
               "unattributed": {**integrals.published(self.unattributed, integrals.METRICS),
                                "energy_mj": _r(self.unattributed_energy_mj),
                                "why": {str(p): w for p, w in sorted(self.unmapped.items())[:16]},
                                "error": self.share_error}}
        if i.mig_enabled:
            out["mig"] = {str(gi): sl.published() for gi, sl in sorted(self.mig.items())}
        return out

    def energy_est_mj(self) -> float | None:
        return None if self.energy_mj is None else self.energy_mj + self.power_since_energy_mj

    def resume(self, prev: dict[str, Any]) -> bool:
        """Continue an earlier agent's series of this GPU (same boot); False when its counters are unusable."""
        counters = resume.counters_of(prev, integrals.METRICS)
        if counters is None or not isinstance(prev.get("series"), str):
            return False
        self.counters = counters  # type: ignore[assignment]  # the Counters shape, checked by counters_of
        self.ticks = int(prev.get("ticks") or 0)
        self.series, self.series_since = prev["series"], float(prev.get("series_since") or 0.0)
        self.series_why = str(prev.get("series_why") or "")
        energy = prev.get("energy_mj")
        self.energy_mj = int(energy) if isinstance(energy, int | float) else None  # until the next read
        mig = prev.get("mig")
        self.mig_prev = mig if isinstance(mig, dict) else {}
        self._new_shares()
        shares = prev.get("shares")
        for j, published in (shares.items() if isinstance(shares, dict) else ()):
            js = JobShare.resumed(published)
            if js is not None:
                self.shares[str(j)] = js
        un = prev.get("unattributed")
        counters = resume.counters_of(un, integrals.METRICS) if isinstance(un, dict) else None
        if counters is not None and isinstance(un, dict):
            self.unattributed = counters  # type: ignore[assignment]  # the Counters shape
            self.unattributed_energy_mj = float(un.get("energy_mj") or 0.0)
        return True

    def restart_series(self, why: str, since: float) -> None:
        """Continuity is lost (a GPU reset): counters from zero, in a new series that says why."""
        self.counters, self.ticks = integrals.new_counters(), 0
        self.series, self.series_since, self.series_why = resume.new_series(), since, why
        self.power_since_energy_mj = 0.0
        self.mig, self.mig_prev = {}, {}
        self._new_shares()


class Agent:
    """Published times come from ``wall_clock``, durations from the samples' monotonic ``t``: tests inject
    both to drive uneven intervals deterministically."""

    def __init__(self, config: Config, sampler: Sampler, *, wall_clock: Callable[[], float] = time.time,
                 energy_interval_s: float | None = None, host: str | None = None,
                 proc_jobs: ProcessJobs | None = None) -> None:
        self.sampler = sampler
        self.clock = wall_clock
        self.interval_s = float(config.agent.interval_s)
        self.timeline_interval_s = float(config.agent.timeline_interval_s)
        self.keep_s = float(config.agent.timeline_keep_h) * 3600.0
        self.energy_interval_s = float(energy_interval_s if energy_interval_s is not None
                                       else max(ENERGY_INTERVAL_S, self.interval_s))
        self.state_dir = config.paths.state_dir
        self.per_user = config.agent.metrics_per_user  # user and account labels on the per-job series
        self.host = host or socket.gethostname()
        self.instance = uuidlib.uuid4().hex
        self.pid = os.getpid()
        self.started = self.clock()
        self.gpus: dict[str, _Gpu] = {}
        self.job_files: dict[str, JobFile] = {}  # file name's job id -> that Prolog file as last read
        self.job_peaks: dict[str, dict[str, int]] = {}
        self.updated: float | None = None
        self.last_energy_t: float | None = None
        self.last_timeline_wall: float | None = None
        self.last_prune_wall: float | None = None
        self.ticks = 0
        self.tick_cpu_s: float | None = None  # cost of the previous tick (published for bench/ and ops)
        self.tick_wall_s: float | None = None
        self.boot = resume.boot_id()
        self.booted_at = resume.booted_at()  # job files older than this hold no GPU (_holders)
        self.gaps: list[list[Any]] = []  # [from, to, why]: times without readings (agent down or stalled)
        self.down_since: tuple[float, str] | None = None  # an earlier agent's last reading: a gap to close
        self.last_sample_mono: float | None = None
        self.proc_jobs = proc_jobs or ProcessJobs()  # tests give a stand-in /proc
        self.prev_reading_wall = self.started  # per-process samples after it belong to the current reading

    def open(self) -> None:
        infos = self.sampler.open()
        prev, why = resume.previous(statedir.agent_state(self.state_dir), STATE_VERSION, self.boot)
        now = self.clock()
        self.gpus = {i.uuid: _Gpu(i, why, now) for i in infos}
        resumed = []
        if prev is not None:
            for u, g in self.gpus.items():
                earlier = prev["gpus"].get(u)
                if isinstance(earlier, dict) and g.resume(earlier):
                    resumed.append(u)
                else:
                    g.series_why = resume.NEW_GPU
            self.gaps = resume.gaps_since(prev, now - self.keep_s)
            self.down_since = (float(prev["updated"]), resume.STOPPED if prev.get("stopped") else resume.DIED)
            jobs = prev.get("jobs")
            if isinstance(jobs, dict):
                self.job_peaks = {str(j): {str(u): int(v) for u, v in p.items() if isinstance(v, int)}
                                  for j, p in jobs.items() if isinstance(p, dict)}
        os.makedirs(statedir.timelines(self.state_dir), mode=0o755, exist_ok=True)
        desc = ", ".join(f"{i.uuid} ({i.model}, {'GPM' if i.gpm_supported else i.gpm_reason})" for i in infos)
        log.info("gpueff agent %s on %s: %d GPU(s), interval %.1f s: %s", self.instance[:8], self.host,
                 len(infos), self.interval_s, desc)
        log.info("counters resumed for %d of %d GPU(s)%s", len(resumed), len(infos), f" ({why})" if why else "")

    def close(self) -> None:
        """Publish a final state marked ``stopped`` (so hooks can say why), then release NVML."""
        try:
            self.write_state(stopped=True)
        except OSError as exc:
            log.warning("could not write the final state: %s", exc)
        try:
            self.sampler.close()
        except Exception as exc:  # noqa: BLE001 - shutting down anyway
            log.warning("sampler close failed: %s", exc)

    def tick(self, requested: bool = False) -> None:
        """One reading of every GPU; ``requested`` (a hook asked for it) reads the energy counter too."""
        cpu0, wall0 = time.process_time(), time.perf_counter()
        last = [g.last_t for g in self.gpus.values() if g.last_t is not None]
        now_mono = max(last) + self.interval_s if last else None
        read_energy = (requested or self.last_energy_t is None or now_mono is None
                       or now_mono - self.last_energy_t >= self.energy_interval_s - self.interval_s / 2)
        self.last_sample_mono = time.monotonic()
        before = self.updated
        self.prev_reading_wall = before if before is not None else self.clock()
        # GPM figures (a costly NVML call) at the energy counter's pace and at every requested reading; every
        # reading for a shared GPU, whose split needs them interval by interval (:mod:`.attribution`).
        samples = self.sampler.sample(read_energy, None if read_energy else
                                      {u for u, js in self._holders().items() if len(js) > 1})
        for s in samples:
            g = self.gpus.get(s.uuid)
            if g is not None:
                self._integrate(g, s, read_energy)
        if read_energy and samples:
            self.last_energy_t = max(s.t for s in samples)
        self.ticks += 1
        self.updated = now = self.clock()
        if self.down_since is not None:  # the first reading after a restart closes the time it was down
            resume.add_gap(self.gaps, self.down_since[0], now, self.down_since[1])
            self.down_since = None
        elif before is not None and now - before > GAP_INTERVALS * self.interval_s:
            resume.add_gap(self.gaps, before, now, f"agent stalled (no reading for {now - before:.0f} s)")
        self._track_jobs()
        self._attribute()
        self.write_state()  # publishes the previous tick's cost
        self._maybe_timeline(now)
        self.tick_cpu_s = time.process_time() - cpu0
        self.tick_wall_s = time.perf_counter() - wall0

    def gpm_tick(self) -> None:
        """GPM only, between full readings (GPM_STEP_S): added to the counters, published at the next reading."""
        self.last_sample_mono = time.monotonic()
        for s in self.sampler.sample_gpm():
            g = self.gpus.get(s.uuid)
            if g is not None and s.gpm is not None:
                g.last.update(_add_gpm(g.counters, s.gpm, s.gpm_dt))

    def _integrate(self, g: _Gpu, s: GpuSample, read_energy: bool) -> None:
        dt = s.t - g.last_t if g.last_t is not None else None
        gap = dt is not None and dt > GAP_INTERVALS * self.interval_s
        held_dt = None if gap else dt  # kernel and power readings stand for [previous tick, this tick]
        c = g.counters
        kernel = s.kernel_pct / 100.0 if s.kernel_pct is not None else None
        power_w = s.power_mw / 1000.0 if s.power_mw is not None else None
        integrals.add(c, "kernel_active", _fraction(kernel), held_dt)
        added = integrals.add(c, "power_w", power_w, held_dt)
        if added and g.energy_mj is not None and power_w is not None and held_dt is not None:
            g.power_since_energy_mj += power_w * held_dt * 1000.0
        if s.energy_mj is not None and g.energy_mj is not None and s.energy_mj < g.energy_mj:
            log.warning("GPU %s: energy counter went back from %d to %d mJ: %s; its counters restart",
                        g.info.uuid, g.energy_mj, s.energy_mj, resume.GPU_RESET)
            g.restart_series(resume.GPU_RESET, self.clock())
            c = g.counters
        if s.energy_mj is not None:
            g.energy_mj = int(s.energy_mj)
            g.energy_read_at = self.clock()
            g.power_since_energy_mj = 0.0
            g.energy_error = None
        elif read_energy and "energy" in s.errors:
            g.energy_error = s.errors["energy"]
        g.memory_used = s.memory_used_bytes
        # A new dict each tick (a scrape reads one whole). GPM figures come only at some readings: until the next,
        # the gauges keep the last ones rather than vanish; a GPM failure drops them (unread is no series).
        last = {**({} if "gpm" in s.errors else g.last), "power_w": power_w}
        if kernel is not None or not g.info.gpm_supported:
            last["kernel_active"] = kernel
        steps: list[tuple[dict[str, float | None], float | None]] = (
            list(s.gpm_steps) if s.gpm_steps else [(s.gpm, s.gpm_dt)] if s.gpm is not None else [])
        for gpm, gpm_dt in steps:
            last.update(_add_gpm(c, gpm, gpm_dt))
        g.last = last
        g.errors = dict(s.errors)
        g.last_t = s.t
        if dt is not None:
            g.ticks += 1
        if s.mig_devices is not None:
            self._integrate_mig(g, s.mig_devices, s.mig or {})

    def _integrate_mig(self, g: _Gpu, devices: list[MigInfo], readings: dict[int, MigSample]) -> None:
        """Per GPU instance: follow (re)configuration, then add its GPM interval means like a GPU's."""
        by_gi: dict[int, list[MigInfo]] = {}
        for d in devices:
            by_gi.setdefault(d.gi_id, []).append(d)
        for gi in [gi for gi in g.mig if gi not in by_gi]:
            log.info("GPU %s: MIG GPU instance %d is gone (MIG reconfigured)", g.info.uuid, gi)
            del g.mig[gi]
        for gi, devs in by_gi.items():
            sl = g.mig.get(gi)
            if sl is None or sl.key != frozenset(d.uuid for d in devs):
                if sl is not None:
                    log.info("GPU %s: MIG GPU instance %d was re-created; its counters restart", g.info.uuid, gi)
                sl = g.mig[gi] = _Slice(gi, sorted(devs, key=lambda d: (d.ci_id or 0, d.uuid)), self.clock())
                _resume_slice(sl, g.mig_prev.pop(str(gi), None))
            ms = readings.get(gi)
            if ms is None:
                sl.errors = {"sample": "no reading of this GPU instance at this tick"}
                continue
            if ms.gpm is not None:
                sl.last = _add_gpm(sl.counters, ms.gpm, ms.gpm_dt)
            sl.gpm_reason = ms.gpm_reason
            sl.memory_used = ms.memory_used_bytes
            sl.errors = dict(ms.errors)
            if sl.seen:
                sl.ticks += 1
            sl.seen = True

    def _mig_slice(self, mig_uuid: str) -> _Slice | None:
        """The slice a MIG device UUID (opaque or legacy ``MIG-GPU-<parent>/<gi>/<ci>``) belongs to now."""
        for g in self.gpus.values():
            for sl in g.mig.values():
                if mig_uuid in sl.key:
                    return sl
        legacy = parse_legacy_mig(mig_uuid)
        if legacy is not None and legacy["parent_uuid"] in self.gpus:
            return self.gpus[legacy["parent_uuid"]].mig.get(legacy["gi_id"])
        return None

    def _track_jobs(self) -> None:
        seen: set[str] = set()
        try:
            entries = jobstate.entries(self.state_dir)  # the Prologs' saved states: the jobs running here
        except OSError as exc:
            log.warning("cannot list %s: %s", statedir.jobs(self.state_dir), exc)
            return
        for e in entries:
            job_id = e.name[:-5]
            try:
                st = e.stat()
            except OSError:
                continue
            seen.add(job_id)
            cached = self.job_files.get(job_id)
            if cached is None or cached.mtime_ns != st.st_mtime_ns or cached.size != st.st_size:
                try:
                    cached = read_job_file(e.path, job_id, st.st_mtime_ns, st.st_size)
                except (OSError, ValueError) as exc:
                    log.debug("job file %s unreadable for now: %s", e.path, exc)
                    cached = JobFile(st.st_mtime_ns, st.st_size, [], (job_id, "", ""))
                self.job_files[job_id] = cached
            peaks = self.job_peaks.setdefault(job_id, {})
            for u in cached.uuids:
                src = self.gpus.get(u) or (self._mig_slice(u) if u.startswith("MIG-") else None)
                used = src.memory_used if src is not None else None
                if used is not None:
                    peaks[u] = max(peaks.get(u, 0), used)
        for job_id in list(self.job_files):
            if job_id not in seen:
                del self.job_files[job_id]
                self.job_peaks.pop(job_id, None)

    def _live_files(self) -> dict[str, JobFile]:
        """The Prolog job files of jobs running now. One older than the boot belongs to a job the reboot killed
        (no Epilog ran to remove it): it holds nothing, or every later job on its GPUs would be split with a
        ghost."""
        return {j: jf for j, jf in self.job_files.items()
                if self.booted_at is None or jf.mtime_ns >= self.booted_at * 1e9}

    def _holders(self) -> dict[str, list[str]]:
        """GPU UUID -> the running jobs whose Prolog named it, sorted."""
        holders: dict[str, list[str]] = {}
        for job_id, jf in sorted(self._live_files().items()):
            for u in jf.uuids:
                if u in self.gpus:
                    holders.setdefault(u, []).append(job_id)
        return holders

    def _attribute(self) -> None:
        """Give each GPU's growth since the previous reading to the jobs holding it (:mod:`.attribution`);
        processes are looked at only on GPUs that more than one job holds."""
        holders = self._holders()
        users = {job_id: jf.labels[1] for job_id, jf in self._live_files().items()}
        shared = {u for u, js in holders.items() if len(js) > 1}
        growth = {u: attribution.delta(g.counters, g.base) for u, g in self.gpus.items()}  # since the last split
        procs: dict[str, ProcSample] = {}
        if shared:
            busy = {u for u in shared if _kernels_ran(growth[u])}
            try:
                procs = self.sampler.sample_processes(shared, self.prev_reading_wall, busy)
            except Exception as exc:  # noqa: BLE001 - a split lost is unattributed, never a dead agent
                log.warning("cannot read the processes of shared GPUs: %s", exc)
        for u, g in self.gpus.items():
            self._split(g, growth[u], holders.get(u, []), procs.get(u) if u in shared else None, users)

    def _split(self, g: _Gpu, d: dict[str, dict[str, float]], holders: list[str], procs: ProcSample | None,
               users: dict[str, str]) -> None:
        e_now = g.energy_est_mj()
        de = max(e_now - g.base_energy, 0.0) if e_now is not None and g.base_energy is not None else 0.0
        dt = max(g.last_t - g.base_t, 0.0) if g.last_t is not None and g.base_t is not None else 0.0
        g.base, g.base_t, g.base_energy = attribution.delta(g.counters, integrals.new_counters()), g.last_t, e_now
        for j in [j for j in g.shares if j not in holders]:  # its Epilog has read it: the job is over here
            del g.shares[j]
        g.parts = {}
        if not holders:
            return
        sp = attribution.split(holders, procs, lambda pid: self.proc_jobs.owner(pid, users))
        if len(holders) > 1:
            measured = sp.unmeasured is None
            g.parts = {j: JobPart(sp.activity.get(j, 0.0) if measured else None,
                                  sp.energy.get(j, 0.0) if measured else None, sp.memory.get(j)) for j in holders}
        for j in holders:
            js = g.shares.get(j)
            if js is None:
                js = g.shares[j] = JobShare()
            if sp.unmeasured is None:
                attribution.add(js, d, sp.activity.get(j, 0.0), sp.energy.get(j, 0.0))
                js.energy_mj += de * sp.energy.get(j, 0.0)
            else:  # nobody's part is known: these seconds are not covered, the job's figures skip them
                js.unmeasured_s += dt
                js.unmeasured_why = sp.unmeasured
            js.tracked_s += dt
            js.held_s += dt / len(holders)
            used = g.memory_used if len(holders) == 1 else sp.memory.get(j)
            if used is not None:
                js.memory_peak = max(js.memory_peak or 0, used)
            if len(holders) > 1:
                js.shared_s += dt
                js.others.update(h for h in holders if h != j)
                if j in sp.how:
                    js.how.add(sp.how[j])
        if len(holders) > 1 and sp.unmeasured is None:
            attribution.add(g.unattributed, d, sp.activity.get(UNATTRIBUTED, 0.0), sp.energy.get(UNATTRIBUTED, 0.0))
            g.unattributed_energy_mj += de * sp.energy.get(UNATTRIBUTED, 0.0)
            g.unmapped = sp.unmapped
            g.share_error = procs.error if procs is not None else "the processes could not be read"

    def state(self, stopped: bool = False) -> dict[str, Any]:
        inventory = {d.uuid: {"parent_uuid": d.parent_uuid, "parent_minor": g.info.minor, "gi_id": d.gi_id,
                              "ci_id": d.ci_id, "profile": d.profile, "memory_total_bytes": d.memory_total_bytes,
                              "gen": sl.gen}
                     for g in self.gpus.values() for sl in g.mig.values() for d in sl.devices}
        return {
            "version": STATE_VERSION, "pid": self.pid, "instance": self.instance, "host": self.host,
            "boot_id": self.boot, "gaps": self.gaps,
            "started": self.started, "updated": self.updated if self.updated is not None else self.clock(),
            "interval_s": self.interval_s, "timeline_interval_s": self.timeline_interval_s,
            "energy_interval_s": self.energy_interval_s, "ticks": self.ticks, "stopped": stopped,
            "cpu_s": round(time.process_time(), 6), "prev_tick_cpu_s": _r(self.tick_cpu_s),
            "prev_tick_wall_s": _r(self.tick_wall_s),
            "gpus": {u: g.published() for u, g in self.gpus.items()}, "mig": inventory,
            "jobs": {j: dict(p) for j, p in self.job_peaks.items()},
        }

    def write_state(self, stopped: bool = False) -> None:
        data = json.dumps(self.state(stopped), separators=(",", ":"), allow_nan=False).encode()
        spool.atomic_write(statedir.agent_state(self.state_dir), data, mode=0o644, durable=False)

    def _maybe_timeline(self, now: float) -> None:
        if self.last_timeline_wall is not None and now - self.last_timeline_wall < self.timeline_interval_s - 1e-6:
            return
        self.last_timeline_wall = now
        series: list[tuple[str, Counters, dict[str, str]]] = []
        for u, g in self.gpus.items():
            series.append((u, g.counters, {"series": g.series}))
            series += [(mig_key(u, gi), sl.counters, {"gen": sl.gen}) for gi, sl in g.mig.items()]
        for u, c, extra in series:
            line = {"t": round(now, 3), "instance": self.instance, **extra,
                    **integrals.published(c, integrals.TIMELINE_METRICS)}
            path = statedir.timeline(self.state_dir, u)
            try:
                with open(path, "a") as fh:
                    fh.write(json.dumps(line, separators=(",", ":"), allow_nan=False) + "\n")
            except OSError as exc:
                log.warning("cannot append to %s: %s", path, exc)
        if self.last_prune_wall is None or now - self.last_prune_wall >= PRUNE_EVERY_S:
            self.last_prune_wall = now
            self.prune_timelines(now)

    def prune_timelines(self, now: float) -> None:
        """Drop timeline lines older than ``agent.timeline_keep_h``."""
        cutoff = now - self.keep_s
        d = statedir.timelines(self.state_dir)
        try:
            names = [n for n in os.listdir(d) if n.endswith(".jsonl")]
        except OSError:
            return
        for n in names:
            path = os.path.join(d, n)
            try:
                with open(path) as fh:
                    lines = fh.readlines()
            except OSError:
                continue
            keep = [ln for ln in lines if (line_time(ln) or 0.0) >= cutoff]
            if len(keep) != len(lines):
                try:
                    spool.atomic_write(path, "".join(keep).encode(), mode=0o644)
                except OSError as exc:
                    log.warning("cannot prune %s: %s", path, exc)

    def collect(self) -> Iterator[Metric]:
        """Live per-GPU gauges for Prometheus (``[agent] metrics_port``; 0, the default, = off), labelled by
        minor, UUID and model, and per-job series for the jobs running now only (:mod:`.job_metrics`), so series
        stay bounded; a figure the agent could not read has no sample, never an invented 0. prometheus_client is
        imported only when the exporter starts."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        act = {m: GaugeMetricFamily(f"gpueff_gpu_{m}_ratio", f"{m.replace('_', ' ')} at the agent's last tick "
                                    "(0-1; GPM metrics on Hopper and newer only)", labels=LABELS)
               for m in ACTIVITIES}
        power = GaugeMetricFamily("gpueff_gpu_power_watts", "Power draw at the last tick", labels=LABELS)
        used = GaugeMetricFamily("gpueff_gpu_memory_used_bytes", "GPU memory in use at the last tick", labels=LABELS)
        total = GaugeMetricFamily("gpueff_gpu_memory_total_bytes", "GPU memory size", labels=LABELS)
        energy = CounterMetricFamily("gpueff_gpu_energy_joules", "Energy since the driver loaded (the agent's "
                                     "estimate between counter reads)", labels=LABELS)
        for g in list(self.gpus.values()):
            info, last = g.info, g.last  # one tick's readings (a new dict each tick)
            labels = [str(info.minor) if info.minor is not None else "", info.uuid, info.model or ""]
            est = g.energy_est_mj()
            readings: list[tuple[GaugeMetricFamily | CounterMetricFamily, float | None]] = [
                *((fam, last.get(m)) for m, fam in act.items()),
                (power, last.get("power_w")), (used, g.memory_used), (total, info.memory_total_bytes),
                (energy, est / 1000.0 if est is not None else None)]
            for fam, v in readings:
                if v is not None:  # an unread figure is a missing series, never 0
                    fam.add_metric(labels, v)
        yield from act.values()
        yield from (power, used, total, energy)
        gpus = {u: GpuNow(g.info, g.last, g.memory_used, g.parts) for u, g in list(self.gpus.items())}
        yield from job_series(dict(self.job_files), gpus, self.per_user)
        yield CounterMetricFamily("gpueff_agent_ticks", "Sampling ticks since the agent started", value=self.ticks)
        if self.updated is not None:
            yield GaugeMetricFamily("gpueff_agent_last_tick_timestamp_seconds", "When the last tick ended",
                                    value=self.updated)
        if self.tick_cpu_s is not None:
            yield GaugeMetricFamily("gpueff_agent_tick_cpu_seconds", "CPU time of the last tick", value=self.tick_cpu_s)


def _resume_slice(sl: _Slice, prev: object) -> None:
    """Continue an earlier agent's counters of a GPU instance that still holds the same MIG devices."""
    if not isinstance(prev, dict) or frozenset(prev.get("devices") or ()) != sl.key:
        return
    counters = resume.counters_of(prev, integrals.METRICS)
    if counters is not None and isinstance(prev.get("gen"), str):
        sl.counters, sl.gen = counters, prev["gen"]  # type: ignore[assignment]  # checked by counters_of
        sl.ticks, sl.since = int(prev.get("ticks") or 0), float(prev.get("since") or sl.since)


def _kernels_ran(d: dict[str, dict[str, float]]) -> bool:
    """Kernels ran (or may have: unread) in a GPU's growth ``d`` since the last split. An idle shared GPU, the
    usual state of one that notebooks share, has no activity to split, so its processes' utilization is not
    read."""
    covered = d["covered_s"]["kernel_active"]
    return not covered or d["sum"]["kernel_active"] > IDLE_KERNEL * covered


def _add_gpm(c: Counters, gpm: dict[str, float | None], dt: float | None) -> dict[str, float | None]:
    """Integrate GPM percentages (exact means over ``dt``); return them as fractions."""
    fractions = {m: (p / 100.0 if p is not None else None) for m, p in gpm.items()}
    for metric, v in fractions.items():
        integrals.add(c, metric, _fraction(v), dt)
    return fractions


def _fraction(v: float | None) -> float | None:
    return integrals.clamp_fraction(v) if v is not None and math.isfinite(v) else None


def _r(v: float | None) -> float | None:
    return round(v, 6) if v is not None and math.isfinite(v) else None
