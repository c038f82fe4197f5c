"""The Slurm Prolog and Epilog: start measuring a job's GPUs, then spool the job's record at its end.

slurmd runs these as root on every job start and end, with no PATH and no HOME, in its log directory.
A hook that exits non-zero DRAINS the node, so the rules are:

* :func:`run` always returns 0 and never raises; every problem is logged (syslog LOG_DAEMON + stderr)
  and, for the Epilog, written into the record's ``reason`` instead of failing.
* The whole hook is bounded by ``collector.hook_timeout_s``: collector work (and reading the Prolog's
  state) runs in a daemon thread joined with a timeout. On timeout the Epilog writes an
  allocation-only record ("collector timed out after N s"). When run as a process (:func:`main`, the
  console scripts and ``hooks/*``) a watchdog also ends the process with status 0 at the bound, and a
  stuck thread is abandoned with ``os._exit``.
* A finished job's record is never dropped: if the spool is unwritable it goes to the first writable
  fallback of ``<state_dir>/spool-fallback``, ``$TMPDIR``, ``/var/tmp`` and ``/tmp`` (each
  ``.../slurm-gpueff-spool-fallback`` for the temp dirs; private 0700 directories owned by us, anything
  else is refused). Fallbacks are node-local, so ingest (often on another host) cannot see them: the
  next Epilog on the node that writes to the real spool moves them back into ``incoming/``.
* Jobs without GPUs (no SLURM_JOB_GPUS / CUDA_VISIBLE_DEVICES) cost nothing: both hooks return before
  even reading the config, and no record is written (CPU-only jobs are a later issue, via sacct).
* Stdlib only and few imports: the hook path must start about as fast as ``python3 -c pass``.

Job state between the two hooks: ``<state_dir>/jobs/<job_id>.json`` =
``{"start": <collector start state>, "start_time", "gpus", "backend", "reason", "written_at", "writer"}``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
import time

from . import __version__, slurmenv, spool
from . import config as cfgmod
from . import record as recmod
from .collectors.base import JobContext, Measurement

# Annotation-only imports: typing costs ~2 ms at start-up, which every Prolog/Epilog would pay.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any, NoReturn

WRITER = f"slurm-gpueff {__version__}"
KINDS = ("prolog", "epilog")
FALLBACK_NAME = "slurm-gpueff-spool-fallback"

# Set when a collector thread is still running after its bound: the process must then leave with
# os._exit (interpreter shutdown could wait on whatever the thread is blocked in).
_stuck = False
# Set by main(): arm the watchdog that ends the *process* at the bound (never in-process callers).
_process_mode = False


# --------------------------------------------------------------------------------------------------
# logging: syslog (LOG_DAEMON) for the site's log collection, stderr for a person running it by hand
class HookLog:
    """Log to syslog and (warnings and errors) to stderr; never raises, works without /dev/log."""

    _PRIO = {"info": 6, "warning": 4, "error": 3}  # LOG_INFO, LOG_WARNING, LOG_ERR

    def __init__(self, kind: str):
        self.kind = kind
        self.lines: list[str] = []
        self._syslog: Any = None
        try:
            import syslog

            syslog.openlog("slurm-gpueff", syslog.LOG_PID, syslog.LOG_DAEMON)
            self._syslog = syslog
        except Exception:  # noqa: BLE001 - no syslog module / socket: stderr still works
            self._syslog = None

    def __call__(self, level: str, msg: str) -> None:
        line = f"{self.kind}: {msg}"
        self.lines.append(f"{level}: {line}")
        if self._syslog is not None:
            try:  # noqa: SIM105 - contextlib would be one more import on the hook path
                self._syslog.syslog(self._PRIO.get(level, 6), line)
            except Exception:  # noqa: BLE001
                pass
        if level != "info":
            try:
                sys.stderr.write(f"slurm-gpueff {level}: {line}\n")
                sys.stderr.flush()
            except Exception:  # noqa: BLE001 - stderr closed by the caller
                pass


# --------------------------------------------------------------------------------------------------
# entry points
def run(kind: str, env: Mapping[str, str] | None = None, config_path: str | None = None) -> int:
    """Run the ``prolog`` or ``epilog`` hook for the job described by ``env``; always returns 0."""
    log = HookLog(kind)
    envd = dict(os.environ if env is None else env)
    ctx: dict[str, Any] = {}
    try:
        if kind not in KINDS:
            log("error", f"unknown hook kind {kind!r} (expected prolog or epilog); doing nothing")
            return 0
        _run(kind, envd, config_path, log, ctx)
    except BaseException as exc:  # noqa: BLE001 - a hook must never fail a job or drain a node
        log("error", f"internal error: {type(exc).__name__}: {exc}")
        if kind == "epilog" and not ctx.get("written"):
            _last_resort(envd, ctx, f"epilog internal error: {type(exc).__name__}: {exc}", log)
    return 0


def main(kind: str, config_path: str | None = None) -> NoReturn:
    """Process entry point (console scripts, hooks/*, ``gpueff hook``): run, then exit 0 at once."""
    global _process_mode
    _process_mode = True
    finish(run(kind, config_path=config_path))


def finish(code: int) -> NoReturn:
    """Exit with ``code``; with ``os._exit`` when a collector thread is stuck (it must not hold us)."""
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


# --------------------------------------------------------------------------------------------------
# the hook body
def _run(kind: str, env: dict[str, str], config_path: str | None, log: HookLog, ctx: dict[str, Any]) -> None:
    t0 = time.monotonic()
    job = slurmenv.parse(env)
    if not job.wants_gpus:
        return  # CPU-only job: nothing to measure, nothing to record (see module docstring)
    # Armed with the default bound first: loading the config can block too (a hung filesystem).
    default_bound = cfgmod.CollectorConfig.hook_timeout_s
    watchdog = _Watchdog(log, t0 + default_bound) if _process_mode else None
    cfg, cfg_problem = load_config(config_path, env, log)
    ctx["cfg"] = cfg
    bound = float(cfg.collector.hook_timeout_s)
    if watchdog is not None:
        watchdog.set_deadline(t0 + bound)
    # Keep a reserve for writing the record after the collector's share of the bound.
    budget = max(0.1, bound - min(2.0, bound * 0.25) - (time.monotonic() - t0))
    if job.job_id is None:
        reason = "; ".join(job.problems)
        log("error", f"cannot identify the job: {reason}")
        if kind == "epilog":
            _last_resort(env, ctx, reason, log)
        return
    if kind == "prolog":
        _prolog(job, cfg, cfg_problem, env, budget, log)
    else:
        _epilog(job, cfg, cfg_problem, env, budget, log, ctx)


def _prolog(job: slurmenv.HookEnv, cfg: cfgmod.Config, cfg_problem: str | None, env: dict[str, str],
            budget: float, log: HookLog) -> None:
    now = _clock(cfg, env)
    jc = _job_context(job, cfg, env, job.gpu_indexes, now, None)
    box: dict[str, Any] = {}

    def work(box: dict[str, Any]) -> Any:
        collector = _get_collector(cfg)
        box["backend"] = collector.name
        return collector.start(jc)

    err = _bounded(work, box, budget, cfg)
    state = box.get("result") if err is None else None
    reasons = [r for r in (cfg_problem, err) if r]
    saved = {"start": state, "start_time": now, "gpus": job.gpu_indexes, "backend": box.get("backend"),
             "reason": "; ".join(reasons) or None, "written_at": time.time(), "writer": WRITER}
    path = job_state_path(cfg, job.job_id)  # type: ignore[arg-type]
    try:
        try:
            data = json.dumps(saved, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            saved["start"] = None
            saved["reason"] = "; ".join(reasons + [f"collector start state not storable: {exc}"])
            data = json.dumps(saved).encode()
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        spool.atomic_write(path, data)
    except OSError as exc:
        log("error", f"job {job.job_id}: cannot save the job state {path}: {exc}; the Epilog will record "
                     "the job without a start time")
        return
    if err:
        log("warning", f"job {job.job_id}: {err}")


def _epilog(job: slurmenv.HookEnv, cfg: cfgmod.Config, cfg_problem: str | None, env: dict[str, str],
            budget: float, log: HookLog, ctx: dict[str, Any]) -> None:
    end = _clock(cfg, env)
    state_path = job_state_path(cfg, job.job_id)  # type: ignore[arg-type]
    box: dict[str, Any] = {}
    holder: dict[str, JobContext] = {}

    def work(box: dict[str, Any]) -> Measurement:
        # Reading the state file is in here too: on a hung filesystem it blocks like a collector would.
        box["saved"] = _load_state(state_path)
        saved, _why = box["saved"]
        gpus = job.gpu_indexes or _int_list((saved or {}).get("gpus"))
        start = (saved or {}).get("start_time") or job.start_time
        holder["jc"] = jc = _job_context(job, cfg, env, gpus, start, end)
        collector = _get_collector(cfg)
        box["backend"] = collector.name
        return collector.stop(jc, (saved or {}).get("start"))

    err = _bounded(work, box, budget, cfg)
    saved, state_problem = box.get("saved", (None, None))
    jc = holder.get("jc") or _job_context(job, cfg, env, job.gpu_indexes, job.start_time, end)
    reasons = [r for r in (cfg_problem, *job.problems) if r]
    if state_problem:
        reasons.append(state_problem + (": start time from SLURM_JOB_START_TIME" if jc.start_time
                                        else ": start time unknown"))
    elif saved and saved.get("reason"):
        reasons.append(f"at job start: {saved['reason']}")
    if jc.start_time is not None and jc.end_time is not None and jc.start_time > jc.end_time:
        reasons.append(f"job start {jc.start_time:.0f} is after job end {jc.end_time:.0f} (clock changed?): "
                       "start time unknown")
        jc.start_time = None
    meas = box.get("result") if err is None else None
    if not isinstance(meas, Measurement):
        why = err or f"collector returned {type(meas).__name__}, not a Measurement"
        meas = _allocation_only(cfg, jc, why)
    rec = build_record(job, jc, meas, reasons)
    data, problem = _serialise(rec)
    if problem is not None:
        log("error", f"job {job.job_id}: {problem}")
        rec = build_record(job, jc, _allocation_only(cfg, jc, problem), reasons)
        data, problem = _serialise(rec)
        if problem is not None:  # our own fields are wrong: keep everything for a person to look at
            _last_resort(env, ctx, f"record does not validate: {problem}", log)
            return
    assert data is not None
    path, primary = write_spool(cfg, env, spool.record_name(rec["job_id"], rec["node"]), data, log)
    if path is None:
        return
    ctx["written"] = True
    if primary:
        drain_fallbacks(cfg, env, log)
    try:
        os.unlink(state_path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log("warning", f"job {job.job_id}: cannot remove job state {state_path}: {exc}")
    level = "warning" if err else "info"
    log(level, f"job {job.job_id}: record {path} ({meas.backend}, {len(meas.gpus)} GPU(s))"
               + (f"; {rec['reason']}" if rec["reason"] else ""))


# --------------------------------------------------------------------------------------------------
# pieces
def load_config(config_path: str | None, env: Mapping[str, str],
                log: HookLog) -> tuple[cfgmod.Config, str | None]:
    """The config (explicit path > $GPUEFF_CONFIG in ``env`` > default file > built-in defaults).

    A broken config must not lose the job: keep every setting that is valid on its own, use defaults
    for the rest, and return the problem so it lands in the record's reason.
    """
    path = config_path or env.get(cfgmod.ENV_VAR) or None
    try:
        if path:
            return cfgmod.load(path), None
        if os.path.exists(cfgmod.DEFAULT_PATH):
            return cfgmod.load(cfgmod.DEFAULT_PATH), None
        return cfgmod.Config(), None
    except Exception as exc:  # noqa: BLE001 - ConfigError, or anything odd while reading
        problem = f"config problem ({exc}); using defaults for the unusable settings"
        log("error", problem)
        return _salvage_config(path or cfgmod.DEFAULT_PATH), problem


def _salvage_config(path: str) -> cfgmod.Config:
    """Every setting of a broken config file that is valid on its own (paths above all)."""
    import tomllib

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
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
    for keep in (good, {s: good[s] for s in ("paths", "site") if s in good}, {}):
        try:
            return cfgmod.Config(keep, source=f"{path} (salvaged)")
        except Exception:  # noqa: BLE001
            continue
    return cfgmod.Config()


def job_state_path(cfg: cfgmod.Config, job_id: int) -> str:
    return os.path.join(cfg.paths.state_dir, "jobs", f"{int(job_id)}.json")


def _load_state(path: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        with open(path, "rb") as fh:
            saved = json.loads(fh.read())
    except FileNotFoundError:
        return None, "no Prolog state for this job (the Prolog did not run, failed, or its state was lost)"
    except (OSError, ValueError) as exc:
        return None, f"Prolog state {path} unreadable ({exc})"
    if not isinstance(saved, dict):
        return None, f"Prolog state {path} is not a JSON object"
    st = saved.get("start_time")
    if not isinstance(st, int | float) or isinstance(st, bool) or not st > 0:
        saved["start_time"] = None
        return saved, f"Prolog state {path} has no valid start time"
    return saved, None


def _int_list(value: Any) -> list[int]:
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def _clock(cfg: cfgmod.Config, env: Mapping[str, str]) -> float:
    """Now; GPUEFF_SIM_NOW overrides it for the simulated backend only (the demo's hours-long jobs)."""
    if cfg.collector.backend == "simulated":
        try:
            sim = float(env.get("GPUEFF_SIM_NOW", ""))
        except ValueError:
            sim = 0.0
        if math.isfinite(sim) and sim > 0:
            return sim
    return time.time()


def _job_context(job: slurmenv.HookEnv, cfg: cfgmod.Config, env: dict[str, str], gpus: list[int],
                 start: float | None, end: float | None) -> JobContext:
    return JobContext(job.job_id or 0, job.node, job.cluster or cfg.site.cluster, list(gpus),
                      start_time=start, end_time=end, env=env)


def _get_collector(cfg: cfgmod.Config) -> Any:
    """The configured backend; if it cannot even be set up, allocation-only with the reason."""
    from .collectors.none import NoneCollector

    try:
        from .collectors.select import get_collector

        return get_collector(cfg)
    except Exception as exc:  # noqa: BLE001 - e.g. a backend module that fails to import
        return NoneCollector(cfg, f"collector backend {cfg.collector.backend!r} unavailable: "
                                  f"{type(exc).__name__}: {exc}")


def _allocation_only(cfg: cfgmod.Config, jc: JobContext, reason: str) -> Measurement:
    from .collectors.none import NoneCollector

    return NoneCollector(cfg, reason).stop(jc, None)


def _bounded(work: Callable[[dict[str, Any]], Any], box: dict[str, Any], timeout: float,
             cfg: cfgmod.Config) -> str | None:
    """Run ``work(box)`` in a daemon thread for at most ``timeout`` s; None on success, else why not."""
    global _stuck

    def target() -> None:
        try:
            box["result"] = work(box)
        except BaseException as exc:  # noqa: BLE001 - reported as the reason, never raised
            box["error"] = exc

    t = threading.Thread(target=target, name="gpueff-collector", daemon=True)
    t.start()
    t.join(timeout)
    if t.is_alive():
        _stuck = True
        return f"collector timed out after {timeout:.3g} s"
    if "error" in box:
        exc = box["error"]
        name = box.get("backend") or cfg.collector.backend
        return f"collector {name} failed: {type(exc).__name__}: {exc}"
    return None


def build_record(job: slurmenv.HookEnv, jc: JobContext, meas: Measurement,
                 reasons: list[str]) -> dict[str, Any]:
    """The spool record (record.py schema) for this job on this node."""
    parts: list[str] = []
    for r in (*reasons, meas.reason):
        if r and r not in parts:
            parts.append(r)
    return {
        "schema": recmod.SCHEMA_VERSION, "cluster": jc.cluster, "node": job.node, "job_id": job.job_id,
        "array_job_id": job.array_job_id, "array_task_id": job.array_task_id,
        "het_job_id": job.het_job_id, "het_job_offset": job.het_job_offset,
        "user": job.user, "uid": job.uid, "account": job.account, "partition": job.partition,
        "start_time": jc.start_time, "end_time": jc.end_time,
        "exit_code": job.exit_code, "signal": job.signal,
        "backend": meas.backend, "reason": "; ".join(parts) or None, "gpus": meas.gpus,
        "written_at": time.time(), "writer": WRITER,
    }


def _serialise(rec: dict[str, Any]) -> tuple[bytes | None, str | None]:
    """(JSON bytes, None) for a record that validates and serialises, else (None, the problem)."""
    try:
        recmod.validate(rec)
        return json.dumps(rec, separators=(",", ":"), allow_nan=False).encode(), None
    except Exception as exc:  # noqa: BLE001 - RecordError, NaN in a timeline, unserialisable values
        return None, f"collector returned an invalid measurement ({exc}); GPU figures dropped"


# --------------------------------------------------------------------------------------------------
# the spool and its fallbacks
def spool_dirs(cfg: cfgmod.Config, env: Mapping[str, str]) -> list[str]:
    """The configured spool, then the fallbacks in the order the hook tries them."""
    out = [cfg.paths.spool_dir, os.path.join(cfg.paths.state_dir, "spool-fallback")]
    for base in (env.get("TMPDIR"), "/var/tmp", "/tmp"):
        if base and os.path.isabs(base):
            out.append(os.path.join(base, FALLBACK_NAME))
    seen: list[str] = []
    for d in out:
        if d not in seen:
            seen.append(d)
    return seen


def _private_dir(path: str, create: bool) -> bool:
    """True if ``path`` is (now) a real directory owned by us and closed to others (0700).

    Fallbacks can live in world-writable /tmp: a directory someone else made (or a symlink) is refused.
    """
    import stat

    if create:
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
        except OSError:
            return False
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o077


def write_spool(cfg: cfgmod.Config, env: Mapping[str, str], name: str, data: bytes, log: HookLog,
                sub: str = spool.INCOMING) -> tuple[str | None, bool]:
    """Write ``data`` as ``<spool>/<sub>/<name>``, else into the first fallback that works.

    Returns (path or None, written to the configured spool).
    """
    errors: list[str] = []
    dirs = spool_dirs(cfg, env)
    for i, d in enumerate(dirs):
        try:
            if i and not _private_dir(d, create=True):
                raise OSError(f"not a private directory owned by uid {os.geteuid()}")
            spool.ensure_dirs(d)
            path = os.path.join(d, sub, name)
            spool.atomic_write(path, data)
        except OSError as exc:
            errors.append(f"{d}: {exc}")
            continue
        if i:
            log("error", f"spool {dirs[0]} is not writable ({errors[0]}); wrote {path} instead. It moves "
                         "back into the spool at the next job end on this node that can write there.")
        return path, i == 0
    log("error", "could not write the job record anywhere (" + "; ".join(errors) + "); record follows: "
        + data.decode(errors="replace"))
    return None, False


def drain_fallbacks(cfg: cfgmod.Config, env: Mapping[str, str], log: HookLog) -> int:
    """Move records stranded in fallback spools back into the configured spool; return how many.

    Copy + fsync into ``incoming/`` then unlink (fallbacks may be on another filesystem). If the spool
    already holds a record for the same job and node, the stranded (older) one goes to ``quarantine/``
    with an ``.error`` note instead of overwriting it: nothing is lost, nothing newer is clobbered.
    """
    primary = cfg.paths.spool_dir
    moved = 0
    for d in spool_dirs(cfg, env)[1:]:
        if not _private_dir(d, create=False):
            continue
        for sub in (spool.INCOMING, spool.QUARANTINE):
            for src in _files(os.path.join(d, sub)):
                name = os.path.basename(src)
                try:
                    with open(src, "rb") as fh:
                        data = fh.read()
                    dest = os.path.join(primary, sub, name)
                    if sub == spool.INCOMING and os.path.exists(dest):
                        dest = os.path.join(primary, spool.QUARANTINE, f"fallback-{name}")
                        spool.atomic_write(dest + ".error", (
                            f"stranded in fallback spool {d}; a newer record for the same job and node "
                            "was already in incoming/\n").encode())
                    spool.atomic_write(dest, data)
                    os.unlink(src)
                    moved += 1
                except OSError as exc:
                    log("warning", f"cannot move {src} back into {primary}: {exc}")
    if moved:
        log("warning", f"moved {moved} record(s) from fallback spools back into {primary}")
    return moved


def _files(d: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(d) if e.is_file() and not e.name.startswith("."))
    except OSError:
        return []


def _last_resort(env: Mapping[str, str], ctx: dict[str, Any], reason: str, log: HookLog) -> None:
    """Keep what Slurm told us about a job we could not record normally, in the spool's quarantine."""
    try:
        cfg = ctx.get("cfg") or cfgmod.Config()
        snapshot = {"error": reason, "written_at": time.time(), "writer": WRITER,
                    "env": {k: v for k, v in env.items() if k.startswith(("SLURM", "CUDA", "GPUEFF"))}}
        name = f"hook-epilog-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}.json"
        data = json.dumps(snapshot, indent=1).encode()
        path, _ = write_spool(cfg, env, name, data, log, sub=spool.QUARANTINE)
        if path:
            spool.atomic_write(path + ".error", (reason + "\n").encode())
            log("error", f"kept the job's environment in {path} for a person to look at")
            ctx["written"] = True
    except BaseException as exc:  # noqa: BLE001
        log("error", f"could not keep the job's environment either: {exc}")


class _Watchdog:
    """Ends the hook *process* with status 0 at its deadline, whatever the main thread is stuck in."""

    def __init__(self, log: HookLog, deadline: float):
        self.log = log
        self.deadline = deadline
        self._wake = threading.Event()
        threading.Thread(target=self._loop, name="gpueff-watchdog", daemon=True).start()

    def set_deadline(self, deadline: float) -> None:
        self.deadline = deadline
        self._wake.set()

    def _loop(self) -> None:
        while True:
            self._wake.clear()
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.log("error", "hook reached its time bound (collector.hook_timeout_s); exiting 0 now")
                os._exit(0)
            self._wake.wait(remaining)


# --------------------------------------------------------------------------------------------------
# installing the hooks for slurm.conf
_TEMPLATE = '''#!{python}
"""slurm-gpueff Slurm {kind}, written by slurm_gpueff.hook.install_hooks for this Python.

slurm.conf: {Kind}={path}   (slurmd runs it as root, without PATH or HOME; it always exits 0)
"""
import sys

try:
{path_line}    from slurm_gpueff import hook
except BaseException as exc:  # a broken install must not drain the node
    sys.stderr.write("slurm-gpueff {kind}: cannot import slurm_gpueff: %r\\n" % (exc,))
    sys.exit(0)
{call}
'''


def install_hooks(dest_dir: str, python: str | None = None, config_path: str | None = None) -> list[str]:
    """Write ``prolog`` and ``epilog`` into ``dest_dir`` with an absolute shebang to this Python.

    slurmd has no PATH, so ``#!/usr/bin/env python3`` would find only /usr/bin/python3 (which may be
    too old, or lack this package). These scripts name ``sys.executable`` (e.g. the venv's python).
    When the package is not installed (it runs from a source checkout), the checkout is put on
    ``sys.path`` explicitly. With ``config_path`` the scripts read that config file (slurmd passes no
    GPUEFF_CONFIG), for sites and test clusters that keep it elsewhere than the default path.
    """
    python = python or sys.executable
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    installed = os.path.basename(pkg_parent) in ("site-packages", "dist-packages")
    path_line = "" if installed else f"    sys.path.insert(0, {pkg_parent!r})\n"
    os.makedirs(dest_dir, mode=0o755, exist_ok=True)
    out = []
    for kind in KINDS:
        path = os.path.join(os.path.abspath(dest_dir), kind)
        call = (f"hook.{kind}_main()" if config_path is None else
                f"hook.main({kind!r}, {os.path.abspath(config_path)!r})")
        text = _TEMPLATE.format(python=python, kind=kind, Kind=kind.capitalize(), path=path,
                                path_line=path_line, call=call)
        spool.atomic_write(path, text.encode(), mode=0o755)
        out.append(path)
    return out
