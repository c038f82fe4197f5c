"""The Slurm Prolog and Epilog: start measuring a job's GPUs, then spool the job's record at its end.

slurmd runs these as root, with no PATH and no HOME; a hook that exits non-zero DRAINS the node. Hence
(docs/DESIGN.md, "Guarantees the code keeps"): :func:`run` returns 0 and never raises; every step that
can block (the config, the Prolog's state, the collector) runs in a daemon thread bounded by
``collector.hook_timeout_s`` (:meth:`HookRun.bounded`), and as a process (:func:`main`) a watchdog exits 0
at the bound; an unwritable spool falls back to :func:`slurm_gpueff.spool.write_with_fallback`, and a job that cannot
be recorded at all keeps its environment in the spool's quarantine. Jobs without GPUs return before even
reading the config. Stdlib only: the hook path starts about as fast as ``python3 -c pass``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time

from . import __version__, jobstate, spool, statedir
from . import config as cfgmod
from . import record as recmod
from .collectors.base import NO_START, JobContext, Measurement, NoneCollector
from .slurm import hookenv

TYPE_CHECKING = False  # typing, for annotations only, would slow every Prolog/Epilog's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, NoReturn, TypeVar

    from .collectors.base import Collector
    from .config import Config

    T = TypeVar("T")

WRITER = f"slurm-gpueff {__version__}"
KINDS = ("prolog", "epilog")

_stuck = False  # a step's thread outlived its bound: main() must leave with os._exit
_process_mode = False  # set by main(): arm the watchdog that ends the *process* (never in-process callers)


class HookLog:
    """Log to syslog (LOG_DAEMON, for the site's log collection) and warnings and errors to stderr (for a
    person running it by hand); never raises, works without /dev/log.

    Syslog is where an error must be seen: slurmd may keep no hook stderr at all. Stderr is written first:
    a syslog daemon that stopped reading blocks syslog(3) (the hook's watchdog still ends the process in
    time, :meth:`HookRun.watchdog`). A line longer than ``SYSLOG_PART`` (the record itself, when it could be
    written nowhere) goes to syslog in numbered parts: syslog(3) sends one datagram per call, and a daemon
    drops or cuts one that is larger than its limit (rsyslog's default is 8 KiB).
    """

    _PRIO = {"info": 6, "warning": 4, "error": 3}  # LOG_INFO, LOG_WARNING, LOG_ERR
    SYSLOG_PART = 2000  # characters of a line per syslog message

    def __init__(self, kind: str):
        self.kind = kind
        self.lines: list[str] = []
        self._syslog: Any = None
        try:
            import syslog

            syslog.openlog("slurm-gpueff", syslog.LOG_PID, syslog.LOG_DAEMON)
            self._syslog = syslog
        except Exception:  # noqa: BLE001 - no syslog module / socket: stderr still works
            pass

    def __call__(self, level: str, msg: str) -> None:
        line = f"{self.kind}: {msg}"
        self.lines.append(f"{level}: {line}")
        if level != "info":
            try:
                sys.stderr.write(f"slurm-gpueff {level}: {line}\n")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - stderr closed by the caller (sys.stderr None)
                pass
        if self._syslog is None:
            return
        size = self.SYSLOG_PART
        parts = [line] if len(msg) <= size else [
            f"{self.kind}: [part {i + 1}/{-(-len(msg) // size)}] {msg[at:at + size]}"
            for i, at in enumerate(range(0, len(msg), size))]
        for part in parts:
            try:  # noqa: SIM105 - contextlib would be one more import on the hook path
                self._syslog.syslog(self._PRIO.get(level, 6), part)
            except Exception:  # noqa: BLE001
                pass


def run(kind: str, env: Mapping[str, str] | None = None, config_path: str | None = None) -> int:
    """Run the ``prolog`` or ``epilog`` hook for the job described by ``env``; always returns 0."""
    log = HookLog(kind)
    if kind not in KINDS:
        log("error", f"unknown hook kind {kind!r} (expected prolog or epilog); doing nothing")
        return 0
    envd = dict(os.environ if env is None else env)
    hook: HookRun | None = None
    try:
        hook = HookRun(kind, envd, log)
        hook.run(config_path)
    except BaseException as exc:  # noqa: BLE001 - a hook must never fail a job or drain a node
        log("error", f"internal error: {type(exc).__name__}: {exc}")
        if kind == "epilog" and not (hook and hook.written):
            why = f"epilog internal error: {type(exc).__name__}: {exc}"
            _last_resort(envd, hook.cfg if hook else None, why, log)
    return 0


def main(kind: str, config_path: str | None = None) -> NoReturn:
    """Process entry point (console scripts, hooks/*, ``gpueff hook``): run, then exit 0 at once, with
    ``os._exit`` when a step's thread is stuck (interpreter shutdown could wait on it)."""
    global _process_mode
    _process_mode = True
    code = run(kind, config_path=config_path)
    if _stuck:
        for stream in (sys.stdout, sys.stderr):
            try:  # noqa: SIM105
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(code)
    sys.exit(code)


def prolog_main() -> NoReturn:
    main("prolog")


def epilog_main() -> NoReturn:
    main("epilog")


class HookRun:
    """One Prolog or Epilog run: the job, its config, its deadline, and what each step found.

    The steps that can block keep what they learn here as they go, so that when one overruns its
    bound the record still gets what was found before it hung (e.g. the Prolog's start time).
    """

    def __init__(self, kind: str, env: dict[str, str], log: HookLog):
        self.t0 = time.monotonic()
        self.kind, self.env, self.log = kind, env, log
        self.job = hookenv.parse(env)
        # The default bound until the config is loaded: loading it can block too (a hung filesystem).
        self.deadline = self.t0 + cfgmod.CollectorConfig.hook_timeout_s
        self.cfg: Config | None = None
        self.reasons: list[str] = []  # for the record's reason
        self.backend: str | None = None  # the collector's name, once chosen
        self.saved: dict[str, Any] | None = None  # the Prolog's state (Epilog)
        self.state_problem: str | None = None
        self.jc: JobContext | None = None  # the job as the collector saw it (Epilog)
        self.written = False  # the Epilog's record (or the last-resort snapshot) is on disk
        self.run_index, self.run_provisional = 0, False  # which run of the job this is (docs/DESIGN.md, "Runs")

    def run(self, config_path: str | None) -> None:
        job = self.job
        if job.gpu_raw is None:
            return  # CPU-only job: nothing to measure, nothing to record (see module docstring)
        watchdog = self.watchdog() if _process_mode else None
        cfg = self.load_config(config_path)
        if watchdog is not None:  # the config's bound replaces the default one
            watchdog.cancel()
            self.watchdog()
        if job.job_id is None:
            reason = "; ".join(job.problems)
            self.log("error", f"cannot identify the job: {reason}")
            if self.kind == "epilog":
                self.written = _last_resort(self.env, cfg, reason, self.log)
            return
        if self.kind == "prolog":
            self.prolog(cfg, job.job_id)
        else:
            self.epilog(cfg, job.job_id)

    def load_config(self, config_path: str | None) -> Config:
        """:func:`read_config` within half the budget (the rest is the collector's, which may still measure
        with the defaults); the defaults, and why, if it does not return in time."""
        loaded, err = self.bounded(lambda: read_config(config_path, self.env, self.log),
                                   self.budget() / 2)
        if loaded is None:
            path = config_path or self.env.get(cfgmod.ENV_VAR) or cfgmod.DEFAULT_PATH
            loaded = cfgmod.Config(), f"config problem (reading {path} {err}); using the defaults"
            self.log("error", loaded[1])
        cfg, problem = loaded
        self.cfg = cfg
        if problem:
            self.reasons.append(problem)
        self.deadline = self.t0 + float(cfg.collector.hook_timeout_s)
        return cfg

    def watchdog(self) -> threading.Timer:
        """End the hook *process* with status 0 at the deadline, whatever the main thread is stuck in."""
        def expire() -> None:
            # Logged from a thread of its own, waited for briefly: a syslog daemon that stopped reading blocks
            # syslog(3), and the exit must not wait on it.
            note = threading.Thread(target=self.log, args=("error", "hook reached its time bound "
                                    "(collector.hook_timeout_s); exiting 0 now"), daemon=True)
            note.start()
            note.join(0.2)
            os._exit(0)

        timer = threading.Timer(self.deadline - time.monotonic(), expire)
        timer.daemon = True
        timer.start()
        return timer

    def budget(self) -> float:
        """Seconds a blocking step may take now, keeping a reserve for writing the record after it."""
        bound = self.deadline - self.t0
        return max(0.1, self.deadline - min(2.0, bound * 0.25) - time.monotonic())

    def bounded(self, work: Callable[[], T], timeout: float) -> tuple[T | None, str | None]:
        """``work()`` in a daemon thread for at most ``timeout`` s: (its result, None), else (None, why
        not: "timed out after N s" or "failed: <exception>")."""
        global _stuck
        done: list[tuple[T | None, str | None]] = []

        def step() -> None:
            try:
                done.append((work(), None))
            except BaseException as exc:  # noqa: BLE001 - becomes the record's reason
                done.append((None, f"failed: {type(exc).__name__}: {exc}"))

        thread = threading.Thread(target=step, name="gpueff-hook-step", daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            _stuck = True
            return None, f"timed out after {round(timeout, 1):g} s"  # to 0.1 s: start-up time varies
        return done[0]

    def collect(self, cfg: Config, work: Callable[[], T]) -> tuple[T | None, str | None]:
        """A collector step within the budget: (its result, None), else (None, the reason)."""
        result, err = self.bounded(work, self.budget())
        if err is None:
            return result, None
        if err.startswith("timed out"):
            return None, f"collector {err}"
        return None, f"collector {self.backend or cfg.collector.backend} {err}"

    def choose_collector(self, cfg: Config) -> Collector:
        """The configured backend (noted in ``backend``); allocation-only, saying why, if it cannot even be set up."""
        try:
            from .collectors.choice import get_collector

            collector = get_collector(cfg)
        except Exception as exc:  # noqa: BLE001 - e.g. a backend module that fails to import
            collector = NoneCollector(cfg, f"collector backend {cfg.collector.backend!r} unavailable: "
                                           f"{type(exc).__name__}: {exc}")
        self.backend = collector.name
        return collector

    def job_context(self, cfg: Config, gpus: list[int], start: float | None, end: float | None) -> JobContext:
        return JobContext(self.job.job_id or 0, self.job.node, self.job.cluster or cfg.site.cluster, list(gpus),
                          start_time=start, end_time=end, env=self.env)

    def prolog(self, cfg: Config, job_id: int) -> None:
        job = self.job
        now = _clock(cfg, self.env)
        jc = self.job_context(cfg, job.gpu_indexes, now, None)
        state, err = self.collect(cfg, lambda: self.choose_collector(cfg).start(jc))
        reasons = self.reasons + ([err] if err else [])
        run = job.restart_count or 0  # the Prolog's count is this run's index
        saved = {"start": state, "start_time": now, "gpus": job.gpu_indexes, "backend": self.backend,
                 "reason": "; ".join(reasons) or None, "run": run, "sluid": job.sluid,
                 "written_at": time.time(), "writer": WRITER,
                 "job": {"job_id": job_id, "user": job.user, "uid": job.uid, "account": job.account,
                         "partition": job.partition, "run": run},
                 "env": {k: v for k, v in self.env.items() if k in hookenv.LIVE_ENV}}
        path = statedir.job(cfg.paths.state_dir, job_id)
        try:
            jobstate.save(path, saved)
        except OSError as exc:
            self.log("error", f"job {job_id}: cannot save the job state {path}: {exc}; the Epilog will "
                              "record the job without a start time")
            return
        if err:
            self.log("warning", f"job {job_id}: {err}")

    def epilog(self, cfg: Config, job_id: int) -> None:
        job, env = self.job, self.env
        end = _clock(cfg, env)
        saved_path = statedir.job(cfg.paths.state_dir, job_id)
        self.jc = self.job_context(cfg, job.gpu_indexes, job.start_time, end)

        def work() -> Measurement:
            # Reading the state file is in here too: on a hung filesystem it blocks like a collector would.
            self.saved, self.state_problem = self.find_state(saved_path)
            saved = self.saved or {}
            gpus = job.gpu_indexes or jobstate.saved_gpus(saved)
            self.jc = jc = self.job_context(cfg, gpus, saved.get("start_time") or job.start_time, end)
            return self.choose_collector(cfg).stop(jc, saved.get("start"))

        meas, err = self.collect(cfg, work)
        jc, saved = self.jc, self.saved
        reasons = [*self.reasons, *job.problems]
        if self.state_problem:
            reasons.append(self.state_problem + (": start time from SLURM_JOB_START_TIME" if jc.start_time
                                                 else recmod.START_UNKNOWN))
        elif saved and saved.get("reason"):
            reasons.append(f"at job start: {saved['reason']}")
        if jc.start_time is not None and jc.end_time is not None and jc.start_time > jc.end_time:
            reasons.append(f"job start {jc.start_time:.0f} is after job end {jc.end_time:.0f} (clock "
                           "changed?): start time unknown")
            jc.start_time = None
        if not isinstance(meas, Measurement):
            why = err or f"collector returned {type(meas).__name__}, not a Measurement"
            meas = NoneCollector(cfg, why).stop(jc, None)  # allocation only, with the reason
        elif self.state_problem and meas.reason == NO_START:
            meas.reason = None  # the state problem above says it already; each GPU's figures still say why
        run = (self.run_index, self.run_provisional)
        rec = build_record(job, jc, meas, reasons, run)
        data, problem = recmod.serialise(rec)
        if problem is not None:
            self.log("error", f"job {job_id}: {problem}")
            rec = build_record(job, jc, NoneCollector(cfg, problem).stop(jc, None), reasons, run)
            data, problem = recmod.serialise(rec)
            if problem is not None:  # our own fields are wrong: keep everything for a person to look at
                self.written = _last_resort(env, cfg, f"record does not validate: {problem}", self.log)
                return
        assert data is not None
        path, primary = spool.write_with_fallback(cfg, env, spool.record_name(job_id, job.node, spool.run_tag(rec)),
                                              data, self.log)
        if path is None:
            return
        self.written = True
        if primary:
            spool.drain_fallbacks(cfg, env, self.log)
        try:
            os.unlink(saved_path)  # another run's, too: that run's Epilog never came
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.log("warning", f"job {job_id}: cannot remove job state {saved_path}: {exc}")
        self.log("warning" if err else "info",
                 f"job {job_id}: record {path} ({meas.backend}, {len(meas.gpus)} GPU(s))"
                 + (f"; {rec['reason']}" if rec["reason"] else ""))

    def find_state(self, path: str) -> tuple[dict[str, Any] | None, str | None]:
        """(saved state, problem) at ``path``, and ``run_index`` set (docs/DESIGN.md, "Runs").

        The Epilog's restart count is this run's, or one more when a requeue ended the run, so the run is
        the one the Prolog saved when it is one of those two and the state is not surely another run's
        (:func:`_other_run`: left by a run whose Epilog never came). Without it the run is the count,
        provisional when above 0: enrichment settles it (storage/enrich.py).
        """
        job = self.job
        count = job.restart_count or 0
        saved, problem = jobstate.load(path)
        if saved is not None and _other_run(job, saved):
            saved, problem = None, f"the Prolog state {path} is another run's (its SLUID differs, or it was saved " \
                                   "before this run started)"
        run = saved.get("run") if saved is not None else None
        if isinstance(run, int) and not isinstance(run, bool) and count - 1 <= run <= count:
            self.run_index = run
        else:
            self.run_index, self.run_provisional = count, count > 0
        return saved, problem


def _other_run(job: hookenv.HookEnv, saved: dict[str, Any]) -> bool:
    """Whether a Prolog state is surely another run's: its SLUID differs, or the Prolog ran well before this
    run started (SLURM_JOB_START_TIME; STATE_SKEW_S allows for the nodes' clocks)."""
    if job.sluid and saved.get("sluid") not in (None, job.sluid):
        return True
    st = saved.get("start_time")
    return bool(job.start_time and isinstance(st, int | float) and st < job.start_time - STATE_SKEW_S)


STATE_SKEW_S = 300.0  # munge's default credential TTL: nodes whose clocks differ more cannot run jobs at all


def read_config(config_path: str | None, env: Mapping[str, str], log: HookLog) -> tuple[Config, str | None]:
    """The config (explicit path > $GPUEFF_CONFIG in ``env`` > default file > built-in defaults) and the
    problem, if any. Unlike the service commands, which refuse a bad config, the hooks keep every setting
    valid on its own (:func:`salvage`) and put the problem in the record's reason: a broken config must
    never lose a job's record."""
    path = config_path or env.get(cfgmod.ENV_VAR) or None
    try:
        if path:
            return cfgmod.load(path), None
        if os.path.exists(cfgmod.DEFAULT_PATH):
            return cfgmod.load(cfgmod.DEFAULT_PATH), None
        return cfgmod.Config(), None
    except Exception as exc:  # noqa: BLE001 - ConfigError, or anything odd while reading
        where = "" if path is None or path in str(exc) else f"{path}: "
        problem = f"config problem ({where}{exc}); using defaults for the unusable settings"
        log("error", problem)
        return salvage(path or cfgmod.DEFAULT_PATH), problem


def salvage(path: str) -> Config:
    """Every setting of a broken config file that is valid on its own (paths above all)."""
    try:  # read() never waits on a FIFO
        data = cfgmod.read(path)
    except Exception:  # noqa: BLE001
        data = {}
    good: dict[str, dict[str, Any]] = {}
    for section, keys in cfgmod.Config().as_dict().items():
        given = data.get(section)
        if not isinstance(given, dict):
            continue
        for key, value in given.items():
            if key in keys:
                try:
                    cfgmod.Config({section: {key: value}})
                except Exception:  # noqa: BLE001
                    continue
                good.setdefault(section, {})[key] = value
    paths_only: dict[str, Any] = {s: good[s] for s in ("paths", "site") if s in good}
    for keep in (good, paths_only, {}):
        try:
            return cfgmod.Config(keep, source=f"{path} (salvaged)")
        except Exception:  # noqa: BLE001
            continue
    return cfgmod.Config()


def _last_resort(env: Mapping[str, str], cfg: Config | None, reason: str, log: HookLog) -> bool:
    """Keep what Slurm told us about a job we could not record, in the spool's quarantine; True once
    it is on disk."""
    try:
        snapshot = {"error": reason, "written_at": time.time(), "writer": WRITER,
                    "env": {k: v for k, v in env.items() if k.startswith(("SLURM", "CUDA", "GPUEFF"))}}
        name = f"hook-epilog-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
        data = json.dumps(snapshot, indent=1).encode()
        path, _ = spool.write_with_fallback(cfg or cfgmod.Config(), env, name, data, log, sub=spool.QUARANTINE)
        if path:
            spool.atomic_write(path + spool.ERROR, (reason + "\n").encode())
            log("error", f"kept the job's environment in {path} for a person to look at")
            return True
    except BaseException as exc:  # noqa: BLE001
        log("error", f"could not keep the job's environment either: {exc}")
    return False


def _clock(cfg: Config, env: Mapping[str, str]) -> float:
    """Now; GPUEFF_SIM_NOW overrides it for the simulated backend only (the demo's hours-long jobs)."""
    if cfg.collector.backend == "simulated":
        try:
            sim = float(env.get("GPUEFF_SIM_NOW", ""))
        except ValueError:
            sim = 0.0
        if math.isfinite(sim) and 0 < sim <= recmod.MAX_TIME:  # a date the database can hold
            return sim
    return time.time()


def build_record(job: hookenv.HookEnv, jc: JobContext, meas: Measurement,
                 reasons: list[str], run: tuple[int, bool] = (0, False)) -> dict[str, Any]:
    """The spool record (record.py schema) for this job on this node; ``run``: (run index, provisional)."""
    parts = [r for r in dict.fromkeys((*reasons, meas.reason)) if r]
    return {
        "schema": recmod.SCHEMA_VERSION, "cluster": jc.cluster, "node": job.node, "job_id": job.job_id,
        "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
        "het_job_id": job.het_job_id, "het_job_offset": job.het_job_offset,
        "user": job.user, "uid": job.uid, "account": job.account, "partition": job.partition,
        "start_time": jc.start_time, "end_time": jc.end_time,
        "exit_code": job.exit_code, "signal": job.signal,
        "backend": meas.backend, "reason": "; ".join(parts) or None, "gpus": meas.gpus,
        "run": run[0], "run_provisional": run[1], "sluid": job.sluid,
        "written_at": time.time(), "writer": WRITER,
    }
