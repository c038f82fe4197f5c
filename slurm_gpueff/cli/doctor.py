"""``gpueff doctor``: what this node offers and which backend the hooks will use, PASS / WARN / FAIL.

FAIL is reserved for what breaks the configured setup (e.g. no hostengine with ``backend = "dcgm"``);
what merely limits it is WARN; exit status 1 if any line FAILs. Every probe is bounded (short timeouts,
subprocesses with a time limit) and none raises: a doctor that crashes on the broken node it is meant
to diagnose is no use.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Any

from .. import spool, statedir
from ..config import Config

PASS, WARN, FAIL = "PASS", "WARN", "FAIL"


class Report:
    def __init__(self) -> None:
        self.lines: list[dict[str, str]] = []

    def add(self, status: str, check: str, detail: str) -> None:
        self.lines.append({"status": status, "check": check, "detail": detail})

    def count(self, status: str) -> int:
        return sum(1 for ln in self.lines if ln["status"] == status)

    def text(self) -> str:
        width = max((len(ln["check"]) for ln in self.lines), default=10)
        out = [f"{ln['status']}  {ln['check']:<{width}}  {ln['detail']}" for ln in self.lines]
        out.append(f"{len(self.lines)} checks: {self.count(FAIL)} failed, {self.count(WARN)} warnings")
        return "\n".join(out)

    def as_json(self) -> str:
        return json.dumps({"schema": "slurm-gpueff/doctor", "checks": self.lines, "failures": self.count(FAIL)},
                          indent=1)


def check_nvml(rep: Report, cfg: Config) -> None:
    bad = FAIL if cfg.collector.backend == "nvml" else WARN
    try:
        import pynvml as nv
    except ImportError as exc:
        rep.add(bad, "nvml", f"pynvml not importable ({exc}); install nvidia-ml-py")
        return
    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        from ..node.nvml_sampler import explain_nvml_error

        rep.add(bad, "nvml", explain_nvml_error(nv, exc))
        return
    try:
        drv, n = _s(nv.nvmlSystemGetDriverVersion()), nv.nvmlDeviceGetCount()
        rep.add(PASS if n else bad, "nvml", f"driver {drv}, {n} GPU(s)")
        for i in range(n):
            _nvml_gpu(rep, nv, i)
    finally:
        nv.nvmlShutdown()


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _nvml_gpu(rep: Report, nv: Any, i: int) -> None:
    h = nv.nvmlDeviceGetHandleByIndex(i)
    name, uuid = _s(nv.nvmlDeviceGetName(h)), _s(nv.nvmlDeviceGetUUID(h))
    try:
        minor: Any = nv.nvmlDeviceGetMinorNumber(h)
    except nv.NVMLError:
        minor = "?"
    bus = _s(nv.nvmlDeviceGetPciInfo(h).busId)
    rep.add(PASS, f"gpu{i}", f"{name} {uuid} /dev/nvidia{minor} {bus}")
    try:
        gpm = bool(nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
        rep.add(PASS if gpm else WARN, f"gpu{i} gpm",
                "GPM supported: SM/tensor/DRAM/FP activity measurable" if gpm
                else "no GPM (pre-Hopper): kernel activity only on the nvml backend")
    except (nv.NVMLError, AttributeError) as exc:
        rep.add(WARN, f"gpu{i} gpm", f"GPM query failed: {exc}")
    try:
        cur, _pending = nv.nvmlDeviceGetMigMode(h)
    except nv.NVMLError as exc:
        rep.add(PASS, f"gpu{i} mig", f"MIG not supported ({exc})")
        return
    if not cur:
        rep.add(PASS, f"gpu{i} mig", "MIG supported, disabled (whole-GPU jobs)")
        return
    slices = []
    for j in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
        try:
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, j)
        except nv.NVMLError:
            continue
        slices.append(f"{_s(nv.nvmlDeviceGetUUID(m))} gi={nv.nvmlDeviceGetGpuInstanceId(m)}")
    rep.add(PASS, f"gpu{i} mig", f"MIG enabled, {len(slices)} slice(s): " + (", ".join(slices) or "none created"))


def check_proc(rep: Report, cfg: Config) -> None:
    from ..node.gpu_ids import PROC_GPUS, proc_gpus

    gpus = proc_gpus()
    if not gpus:
        rep.add(WARN, "driver ids", f"no GPUs in {PROC_GPUS}: the dcgm backend cannot map Slurm indexes here")
        return
    rep.add(PASS, "driver ids", ", ".join(f"/dev/nvidia{m}={g['uuid']}" for m, g in sorted(gpus.items())))


def check_dcgm(rep: Report, cfg: Config) -> None:
    from ..collectors import dcgm_bindings as dcgmb

    bad = FAIL if cfg.collector.backend == "dcgm" else WARN
    b: dcgmb.Bindings | None = None
    try:
        found = dcgmb.import_bindings(cfg.dcgm.bindings_path)
    except dcgmb.DcgmUnavailable as exc:
        rep.add(bad, "dcgm bindings", str(exc))
    else:
        try:
            found.structs._dcgmInit()
            rep.add(PASS, "dcgm bindings", f"{found.path} (DCGM {dcgmb.version(found) or 'version unknown'})")
            b = found
        except Exception as exc:  # noqa: BLE001 - libdcgm missing etc.
            rep.add(bad, "dcgm bindings", f"{found.path}: library not loadable: {dcgmb.describe(exc)}")
    why = dcgmb.probe(cfg.dcgm.hostengine, cfg.dcgm.connect_timeout_s)
    if why:
        rep.add(bad, "dcgm hostengine", why)
        return
    if b is None:
        rep.add(WARN, "dcgm hostengine", f"{cfg.dcgm.hostengine} accepts connections, but no usable bindings")
        return
    try:
        h = dcgmb.connect(b, cfg.dcgm.hostengine, cfg.dcgm.connect_timeout_s)
        try:
            ids = list(b.agent.dcgmGetAllSupportedDevices(h))
        finally:
            dcgmb.disconnect(b, h)
        rep.add(PASS, "dcgm hostengine", f"{cfg.dcgm.hostengine}: {len(ids)} GPU(s) supported by DCGM")
    except Exception as exc:  # noqa: BLE001
        rep.add(bad, "dcgm hostengine", f"{cfg.dcgm.hostengine}: {dcgmb.describe(exc)}")


def check_backend(rep: Report, cfg: Config) -> None:
    from ..collectors.choice import get_collector

    name = get_collector(cfg).name
    what = {"dcgm": "DCGM via nv-hostengine", "nvml": "the gpueff agent (NVML/GPM)",
            "simulated": "SIMULATED GPUs", "none": "allocation-only records (no GPU figures)"}.get(name, name)
    rep.add(WARN if name == "none" else PASS, "backend",
            f"collector.backend = {cfg.collector.backend!r}: the hooks would use {what}")


def check_agent(rep: Report, cfg: Config) -> None:
    """The agent's state as the nvml collector reads it at job start: the hooks' verdict, word for word."""
    from ..collectors.nvml import NvmlCollector
    from ..node.tickwire import request_reading

    bad = FAIL if cfg.collector.backend == "nvml" else WARN
    st, why = NvmlCollector(cfg).read_state()
    if why is None and st is not None:
        age = time.time() - float(st["updated"])
        rep.add(PASS, "agent", f"pid {st.get('pid')}, {len(st['gpus'])} GPU(s), updated {age:.1f} s ago")
        t0 = time.monotonic()
        answer, late = request_reading(cfg.paths.state_dir, float(cfg.collector.tick_wait_s))
        rep.add(PASS if answer else WARN, "agent readings", f"a reading on request in {time.monotonic() - t0:.2f} s"
                if answer else f"{late}: jobs' windows fall back to the agent's last reading (up to "
                "agent.interval_s off at each end)")
    elif st is None and not os.path.exists(statedir.agent_state(cfg.paths.state_dir)):
        rep.add(bad, "agent", f"{why}; start etc/gpueff-agent.service")
    else:  # unreadable, hung or dead; only a stopped agent is a mere warning where nvml is not the backend
        rep.add(bad if st and st.get("stopped") else FAIL, "agent", str(why))


def slurm_config(cfg: Config) -> tuple[str | None, dict[str, str]]:
    """(source, {Prolog, Epilog, PrologFlags, ClusterName}) from ``scontrol show config``, else slurm.conf."""
    from ..slurm.commands import hook_keys, show_config
    from ..slurm.runner import SlurmCommandError, SlurmRunner

    try:
        return "scontrol show config", show_config(SlurmRunner.from_config(cfg))
    except SlurmCommandError:
        pass
    for path in (os.environ.get("SLURM_CONF") or "", "/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf"):
        if path and os.path.isfile(path):
            with open(path, errors="replace") as fh:
                return path, hook_keys(line.split("#", 1)[0] for line in fh)
    return None, {}


def check_slurm(rep: Report, cfg: Config) -> None:
    source, conf = slurm_config(cfg)
    if source is None:
        rep.add(WARN, "slurm", "no scontrol and no slurm.conf found: cannot check Prolog/Epilog and ClusterName")
        return
    _check_cluster(rep, cfg, source, conf.get("ClusterName"))
    _check_accounting(rep, cfg, source, conf.get("AccountingStorageType"))
    for key in ("Prolog", "Epilog"):
        v = conf.get(key)
        if not v or v == "(null)":
            rep.add(FAIL, f"slurm {key}", f"not set ({source}); see etc/slurm.conf.snippet")
        elif "gpueff" in v:
            rep.add(PASS, f"slurm {key}", f"{v} ({source})")
        else:
            rep.add(WARN, f"slurm {key}", f"{v} ({source}): does not look like slurm-gpueff's hook")
    flags = conf.get("PrologFlags", "")
    if "alloc" in flags.lower():
        rep.add(PASS, "slurm PrologFlags", flags)
    else:
        rep.add(WARN, "slurm PrologFlags", f"{flags or '(none)'}: add Alloc so the Prolog runs at allocation, "
                                           "before the job")


def _check_accounting(rep: Report, cfg: Config, source: str, storage: str | None) -> None:
    """[sacct] accounting against whether Slurm keeps accounting at all (AccountingStorageType)."""
    if not storage or storage == "(null)":
        return
    kept = not storage.endswith("/none")
    if kept == cfg.sacct.accounting:
        rep.add(PASS, "slurm accounting", f"{storage} ({source}); [sacct] accounting = {str(kept).lower()}")
    elif kept:
        rep.add(WARN, "slurm accounting", f"Slurm keeps accounting ({storage}, {source}) but [sacct] accounting = "
                                          "false: cards never show a job's final state; set it true")
    else:
        rep.add(WARN, "slurm accounting", f"Slurm keeps no accounting ({storage}, {source}): set [sacct] accounting "
                                          "= false, so that cards say what the Epilog saw is final and nothing "
                                          "waits for sacct")


def _check_cluster(rep: Report, cfg: Config, source: str, name: str | None) -> None:
    """site.cluster against Slurm's ClusterName. The hooks (SLURM_CLUSTER_NAME) and sacct name jobs by
    ClusterName, site.cluster names them where Slurm does not say: if the two differ, one cluster's jobs
    are split under two names (and enrichment asks sacct -M for a cluster it does not know)."""
    if not name:
        rep.add(WARN, "slurm ClusterName", f"not found ({source}): cannot compare it with site.cluster")
    elif name == cfg.site.cluster:
        rep.add(PASS, "slurm ClusterName", f"{name} = site.cluster ({source})")
    else:
        rep.add(WARN, "slurm ClusterName", f"Slurm's ClusterName is {name!r} ({source}) but site.cluster is "
                                           f"{cfg.site.cluster!r}: set site.cluster = {name!r}")


def check_dirs(rep: Report, cfg: Config) -> None:
    for check, path, private in (("spool dir", cfg.paths.spool_dir, True), ("state dir", cfg.paths.state_dir, False)):
        try:
            st = os.stat(path)
        except FileNotFoundError:
            parent = os.path.dirname(path.rstrip("/")) or "/"
            ok = os.access(parent, os.W_OK)
            rep.add(WARN if ok else FAIL, check, f"{path} missing; " + (
                "the hooks create it" if ok else f"and {parent} is not writable by uid {os.geteuid()}"))
            continue
        except OSError as exc:
            rep.add(FAIL, check, f"{path}: {exc}")
            continue
        mode = stat.S_IMODE(st.st_mode)
        if not stat.S_ISDIR(st.st_mode):
            rep.add(FAIL, check, f"{path} is not a directory")
        elif not os.access(path, os.W_OK):
            rep.add(FAIL, check, f"{path} not writable by uid {os.geteuid()} (mode {mode:04o}, owner {st.st_uid})")
        elif private and mode & 0o077:
            rep.add(WARN, check, f"{path} mode {mode:04o}: records name users and accounts; 0700 recommended")
        else:
            rep.add(PASS, check, f"{path} writable, mode {mode:04o}, owner uid {st.st_uid}")


def check_spool(rep: Report, cfg: Config) -> None:
    """Records waiting longer than ``[spool] stuck_h`` (ingest not running, or failing on them) and what ingest
    quarantined: each needs a person; the ``.error`` beside a quarantined entry says why."""
    now = time.time()
    ages: list[float] = []
    quarantined: list[str] = []
    incoming, qdir = spool.incoming_dir(cfg.paths.spool_dir), spool.quarantine_dir(cfg.paths.spool_dir)
    with contextlib.suppress(FileNotFoundError), os.scandir(incoming) as it:
        ages = [now - e.stat(follow_symlinks=False).st_mtime for e in it if not e.name.startswith(".")]
    stuck = [a for a in ages if a > cfg.spool.stuck_h * 3600]
    with contextlib.suppress(FileNotFoundError), os.scandir(qdir) as it:
        quarantined = [e.name for e in it if not e.name.endswith(spool.ERROR) and not e.name.startswith(".")]
    found = []
    if stuck:
        found.append(f"{len(stuck)} record(s) in {incoming} waiting longer than {cfg.spool.stuck_h:g} h (the oldest "
                     f"{max(stuck) / 3600:.1f} h): is ingest (or gpueff forward) running? `gpueff ingest` says why")
    if quarantined:
        found.append(f"{len(quarantined)} in quarantine ({qdir}; each NAME.error says why; move a record back "
                     "into incoming/ once fixed, or delete it)")
    if found:
        rep.add(WARN, "spool", "; ".join(found))
    else:
        rep.add(PASS, "spool", f"{len(ages)} record(s) waiting in {incoming}, none stuck; quarantine empty")


def check_spool_space(rep: Report, cfg: Config) -> None:
    """Room in the spool's filesystem for the largest record it takes (``[spool] max_file_mb``) and an inode: a
    full or read-only one sends every Epilog's record to a fallback. "Writable" (check_dirs) is only the
    permission."""
    from .. import fmt

    path = cfg.paths.spool_dir
    where = _existing(path)
    try:
        st = os.statvfs(where)
    except OSError as exc:
        rep.add(FAIL, "spool space", f"{path}: cannot read its filesystem ({exc})")
        return
    root = os.geteuid() == 0  # the hooks and the forwarder run as root, who may use the reserved blocks
    free = (st.f_bfree if root else st.f_bavail) * st.f_frsize
    inodes = st.f_ffree if root else st.f_favail
    room = int(cfg.spool.max_file_mb * 1024 * 1024)
    kind = spool.filesystem(where)[1] or "filesystem type unknown"
    said = f"{fmt.gib(free)} GiB free ({kind})"
    if st.f_flag & os.ST_RDONLY:
        rep.add(FAIL, "spool space", f"{path} is on a read-only filesystem: every job's record goes to a fallback "
                                     "spool")
    elif free < room or (st.f_files and not inodes):
        rep.add(FAIL, "spool space", f"{path}: its filesystem is full ({said}, {inodes} inodes; a record takes up "
                                     f"to {cfg.spool.max_file_mb:g} MiB, [spool] max_file_mb): every job's record "
                                     "goes to a fallback spool; free some space")
    elif kind in spool.VOLATILE_FS:
        rep.add(WARN, "spool space", f"{path} is on {kind}: the records waiting there are lost at a reboot; put "
                                     "paths.spool_dir on persistent storage")
    else:
        rep.add(PASS, "spool space", f"{path}: {said}")


def _existing(path: str) -> str:
    """``path``, else its nearest parent that exists (what a missing spool would be made in)."""
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def check_spool_fallback(rep: Report, cfg: Config) -> None:
    """Records the Epilog put in a fallback spool because the spool would not take them: FAIL while any wait
    (saying where, how many, and whether a reboot loses them); else where the next one would go."""
    from ..access.client import api_url

    waiting = []
    for d in spool.fallback_dirs(cfg, os.environ):
        records, quarantined = spool.waiting(d)
        if records or quarantined:
            what = [f"{records} record(s) in {d}/{spool.INCOMING}"] if records else []
            what += [f"{quarantined} in {d}/{spool.QUARANTINE} (each NAME.error says why)"] if quarantined else []
            how = spool.NOT_PERSISTENT if spool.volatile(d) else "persistent"
            waiting.append(f"{' and '.join(what)} ({how})")
    if waiting:
        then = ("`gpueff forward` sends the records from there" if api_url(cfg.service) else
                "nothing sends them from there (no [service] api_url)")
        rep.add(FAIL, "spool fallback", f"waiting in fallback spools, not in {cfg.paths.spool_dir}: "
                + "; ".join(waiting) + f". {then}; the next job end on this node that can write the spool "
                "moves them back")
        return
    ranked = spool.ranked_fallbacks(cfg, os.environ)
    if not ranked:
        rep.add(WARN, "spool fallback", "no fallback spool: set paths.spool_fallback_dir")
        return
    first, vol = ranked[0]
    if vol:
        rep.add(WARN, "spool fallback", f"none waiting; if {cfg.paths.spool_dir} fails, records go to {first}: "
                                        f"tmpfs, {spool.NOT_PERSISTENT}; set paths.spool_fallback_dir to a "
                                        "directory on persistent storage (best another filesystem than the spool's)")
        return
    same = spool.filesystem(first)[0] == spool.filesystem(cfg.paths.spool_dir)[0]
    rep.add(PASS, "spool fallback", f"none waiting; if {cfg.paths.spool_dir} fails, records go to {first} "
                                    "(persistent" + ("; the spool's filesystem: a full one fills it too" if same
                                                     else "") + ")")


def check_forwarder(rep: Report, cfg: Config) -> None:
    """``gpueff forward`` runs: its heartbeat (node/push.py) names a live forwarder whose next pass is not overdue
    by more than three intervals (at least FORWARDER_GRACE_S); FAIL saying when it last ran. Where the node has no
    api_url there is no forwarder."""
    from .. import fmt
    from ..access.client import api_url
    from ..node.push import read_heartbeat

    if not api_url(cfg.service):
        rep.add(PASS, "forwarder", "none to check: no [service] api_url (the shared-spool layout, where the "
                                   "service ingests the spool itself)")
        return
    beat = read_heartbeat(cfg)
    deadline = time.monotonic() + FORWARDER_START_S
    while beat is None and time.monotonic() < deadline and _forwarders(cfg):  # started a moment ago, as right
        time.sleep(0.2)  # after `systemctl enable --now gpueff-forward`: give it its first heartbeat
        beat = read_heartbeat(cfg)
    path = statedir.forward_heartbeat(cfg.paths.state_dir)
    start = "systemctl enable --now gpueff-forward"
    if beat is None:
        rep.add(FAIL, "forwarder", f"gpueff forward has not run here (no {path} since the state dir was made, e.g. "
                                   f"at boot): this node's records are not sent; {start}")
        return
    t = beat.get("time")
    if "unreadable" in beat or not isinstance(t, int | float):
        rep.add(FAIL, "forwarder", f"{path}: {beat.get('unreadable', 'no time in it')}")
        return
    now = time.time()
    ago = f"last ran {fmt.hms(max(0.0, now - t))} ago ({fmt.utc_seconds(datetime.fromtimestamp(t, UTC))})"
    interval = cfg.service.forward_interval_s
    slack = max(3 * interval, FORWARDER_GRACE_S)
    due = beat.get("next_due")
    pid = beat.get("pid")
    if beat.get("stopped"):
        rep.add(FAIL, "forwarder", f"gpueff forward stopped: it {ago}; {start}")
    elif beat.get("once"):
        ok = now - t <= slack
        rep.add(PASS if ok else FAIL, "forwarder", f"gpueff forward --once {ago}" + (
            "" if ok else f"; no forwarder runs (each pass every {interval:g} s): {start}"))
    elif isinstance(pid, int) and not _forwarder_alive(pid):
        rep.add(FAIL, "forwarder", f"gpueff forward (pid {pid}) is not running: it {ago}; {start}")
    elif isinstance(due, int | float) and now > due + slack:
        rep.add(FAIL, "forwarder", f"gpueff forward {ago} and is overdue (next pass was due "
                                   f"{fmt.hms(now - due)} ago): is it hung? {start}")
    elif beat.get("ok") is False:
        rep.add(WARN, "forwarder", f"gpueff forward runs ({ago}), but its last pass left {beat.get('left')} "
                                   f"record(s): {beat.get('error')}")
    else:
        rep.add(PASS, "forwarder", f"gpueff forward runs (pid {pid}): {ago}")


FORWARDER_START_S = 15.0  # how long a forwarder that runs but has written no heartbeat yet is waited for
FORWARDER_GRACE_S = 30.0  # the least lateness that counts (3 intervals at most): a pass, and this check, take time


def _forwarder_alive(pid: int) -> bool:
    """Whether ``pid`` is a running ``gpueff forward`` (not a process that took the number since)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return _is_forwarder(fh.read())
    except OSError:
        return False


def _is_forwarder(cmdline: bytes) -> bool:
    args = cmdline.split(b"\0")
    return b"forward" in args and any(a.endswith(b"gpueff") or b"slurm_gpueff" in a for a in args)


def _forwarders(cfg: Config) -> list[int]:
    """The pids of the ``gpueff forward`` processes running here (as /proc shows them) with this config."""
    from ..config import DEFAULT_PATH, ENV_VAR

    out = []
    with contextlib.suppress(OSError), os.scandir("/proc") as it:
        for e in it:
            if not e.name.isdigit() or not _forwarder_alive(int(e.name)):
                continue
            try:
                with open(f"/proc/{e.name}/cmdline", "rb") as fh:
                    args = [a.decode(errors="replace") for a in fh.read().split(b"\0")]
                named = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--config"), None)
                named = named or next((a.split("=", 1)[1] for a in args if a.startswith("--config=")), None)
                if named is None:
                    with open(f"/proc/{e.name}/environ", "rb") as fh:
                        env = dict(v.decode(errors="replace").partition("=")[::2] for v in fh.read().split(b"\0"))
                    named = env.get(ENV_VAR) or DEFAULT_PATH
                where = os.path.join(os.readlink(f"/proc/{e.name}/cwd"), named)
            except OSError:
                continue
            if os.path.realpath(where) == os.path.realpath(cfg.source):
                out.append(int(e.name))
    return out


def check_db(rep: Report, cfg: Config) -> None:
    """The database: its files private (SQLite), reachable, not damaged (a bounded ``quick_check``; on a
    server a row read from each table), and at the schema revision this version needs."""
    from ..storage.db import engine_for
    from ..storage.dburl import database_url, sqlite_file

    path = sqlite_file(database_url(cfg.paths.database))
    if path and not os.path.exists(path):
        rep.add(WARN, "database", f"{path} does not exist (yet): `gpueff ingest` creates it on the ingest host")
        return
    if path:
        check_db_files(rep, path)
    try:
        engine = engine_for(cfg.paths, create=False, read_only=True, checking=True)
    except Exception as exc:  # noqa: BLE001 - the password file refused or unreadable, a malformed URL
        rep.add(FAIL, "database", f"{_db_name(cfg)}: {_line(exc, cfg)}")
        return
    if path:
        from ..storage.integrity import found

        damage = found(path)
        if damage is not None:
            rep.add(FAIL, "database damage mark", f"{path}: {damage.message(path)}")
    try:
        _check_db_content(rep, cfg, engine, bool(path))
    finally:
        engine.dispose()
    if path and (os.geteuid() == 0 or os.stat(path).st_uid == os.geteuid()):
        check_db_writable(rep, path)


def check_db_writable(rep: Report, path: str) -> None:
    """Whether a writer can take the SQLite file's write lock (then let it go, changing nothing): a file whose
    header says a newer format (read-only to this SQLite), on a read-only mount or without write permission
    reads fine and fails every ingest."""
    import sqlite3

    try:
        con = sqlite3.connect(path, timeout=5.0, isolation_level=None)
        try:
            con.execute("BEGIN IMMEDIATE")
            con.execute("ROLLBACK")
        finally:
            con.close()
    except sqlite3.OperationalError as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            rep.add(WARN, "database writable", f"{path}: another writer holds the lock ({exc}); try again")
        else:
            rep.add(FAIL, "database writable", f"{path} cannot be written ({exc}): every ingest would fail; "
                                               "check the mount, the file's permissions, or restore it from a backup")
        return
    except sqlite3.Error as exc:
        rep.add(FAIL, "database writable", f"{path} cannot be written ({exc}): every ingest would fail")
        return
    rep.add(PASS, "database writable", f"{path}: a writer can take its lock")


def _db_name(cfg: Config) -> str:
    """The database as doctor names it: its URL (no password) to those who administer it, else no address."""
    from ..storage.dburl import safe_url, shown_here

    return safe_url(cfg.paths.database) if shown_here(cfg) else "the job database"


def _line(exc: BaseException, cfg: Config) -> str:
    """What the driver said (its host, port, path) to those who administer the database, else its kind."""
    from ..storage.db import first_line
    from ..storage.dburl import shown_here

    return first_line(exc)[:300] if shown_here(cfg) else type(exc).__name__


def _check_db_content(rep: Report, cfg: Config, engine: Any, sqlite: bool) -> None:
    from sqlalchemy import text

    from ..storage import migrate
    from ..storage.db import DatabaseDamaged
    from ..storage.integrity import check

    name = _db_name(cfg)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            rev, foreign = migrate.current(conn), migrate.foreign_tables(conn)
            rep.add(PASS, "database", f"{name} reachable")
            state, detail = check(conn, 20.0) if sqlite or rev == migrate.head() else ("", "")
    except DatabaseDamaged as exc:
        rep.add(FAIL, "database", f"{name}: {exc}; restore it from a backup")
        return
    except Exception as exc:  # noqa: BLE001
        if sqlite:
            rep.add(FAIL, "database", f"{name}: cannot read it ({_line(exc, cfg)})")
        else:
            rep.add(WARN, "database", f"{name}: not reachable from here ({type(exc).__name__}: {_line(exc, cfg)}); "
                                      "only the ingest host needs it")
        return
    if state == "damaged":
        rep.add(FAIL, "database integrity", f"{name} is damaged ({detail[:300]}): restore it from a backup")
    elif state:
        rep.add(PASS if state == "ok" else WARN, "database integrity", detail)
    head = migrate.head()
    if foreign:
        rep.add(FAIL, "database schema", f"not a slurm-gpueff database: it holds other tables "
                                         f"({', '.join(foreign[:5])}) and no schema revision")
    elif rev == head:
        rep.add(PASS, "database schema", f"at revision {rev}, the newest")
    elif rev and not migrate.known(rev):
        rep.add(FAIL, "database schema", f"at revision {rev}, unknown to this version (newest {head}): a newer "
                                         "slurm-gpueff's database, or another program's")
    else:
        how = "the next `gpueff ingest` upgrades it" if sqlite else "run `gpueff db upgrade` on the service host"
        rep.add(WARN, "database schema", f"at revision {rev or '(none)'}, this version needs {head}: {how}")


def check_db_files(rep: Report, path: str) -> None:
    """The SQLite file (and its ``-wal``/``-shm``) and its directory: not readable by every user. Only
    reported, never changed: the fix is the administrator's (``chmod``)."""
    path = os.path.abspath(path)
    bad: list[str] = []
    group: list[str] = []
    for f in (path, path + "-wal", path + "-shm"):
        try:
            st = os.stat(f)
        except OSError:
            continue
        mode = stat.S_IMODE(st.st_mode)
        if mode & 0o004:
            bad.append(f"{f} is readable by every user (mode {mode:04o}): chmod 600 {f}")
        elif mode & 0o040:
            group.append(f"{f} is readable by group {st.st_gid} (mode {mode:04o})")
    folder = os.path.dirname(path)
    try:
        st = os.stat(folder)
        mode = stat.S_IMODE(st.st_mode)
        if mode & stat.S_ISVTX:
            group.append(f"{folder} is a shared directory (mode {mode:04o}): give the database a directory "
                         "of its own, mode 0700")
        elif mode & 0o004:
            bad.append(f"{folder} is readable by every user (mode {mode:04o}): chmod 700 {folder}")
    except OSError as exc:
        bad.append(f"{folder}: {exc}")
    if bad:
        rep.add(FAIL, "database files", "; ".join(bad) + " (the database holds every user's jobs)")
    elif group:
        rep.add(WARN, "database files", "; ".join(group) + ": fine only if that group is the service's")
    else:
        rep.add(PASS, "database files", f"{path} and its directory private to their owner")


def check_metrics(rep: Report, cfg: Config) -> None:
    """The service's /metrics: per-user series (each user's GPU-hours and waste) must not be open to every local
    user. Says nothing where there is nothing to say (no per-user series, no token file)."""
    s = cfg.service
    _metrics_privacy(rep, "metrics", "service", s.metrics_address, s.metrics_port, s.metrics_per_user,
                     s.metrics_token_file, "`gpueff serve` refuses to start",
                     "every local user can read every user's GPU-hours")


def check_agent_metrics(rep: Report, cfg: Config) -> None:
    """The agent's /metrics on a GPU node: with per-user series on (job ids labelled with their user and
    account), a token, as for the service's (:func:`check_metrics`); any user with a job here reaches
    127.0.0.1. Says nothing when the endpoint is off, or has neither."""
    a = cfg.agent
    _metrics_privacy(rep, "agent metrics", "agent", a.metrics_address, a.metrics_port, a.metrics_per_user,
                     a.metrics_token_file, "the agent serves no /metrics",
                     "every user with a job on this node can read who runs which job")


def _metrics_privacy(rep: Report, check: str, section: str, address: str, port: int, per_user: bool,
                     token_file: str, if_unreadable: str, exposed: str) -> None:
    """One /metrics endpoint's privacy: its token file usable (FAIL: ``if_unreadable`` follows), else per-user
    series open to whoever reaches ``address`` (WARN: ``exposed``)."""
    from ..config import read_secret
    from ..errors import GpueffError

    if not port or not (per_user or token_file):
        return
    if token_file:
        try:
            read_secret(token_file, f"{section}.metrics_token_file", "the bearer token Prometheus sends")
        except GpueffError as exc:
            rep.add(FAIL, check, f"{exc}; {if_unreadable}")
            return
        rep.add(PASS, check, f"/metrics on {address}:{port} answers only the bearer token in {token_file}")
    else:
        rep.add(WARN, check, f"{section}.metrics_per_user = true and no {section}.metrics_token_file: {exposed} on "
                             f"{address}:{port}; set a token file (chmod 600) and Prometheus' "
                             "authorization.credentials_file")


def _closed_to_others(path: str, want: int) -> str | None:
    """The first folder on the way to ``path`` that other users cannot enter, or ``path`` itself when they
    lack ``want`` (stat bits for others) on it; None when every user can reach and use it."""
    path = os.path.abspath(path)
    parts = path.split(os.sep)
    for i in range(2, len(parts)):
        d = os.sep.join(parts[:i]) or os.sep
        try:
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return d
        except OSError:
            return d
    try:
        return None if os.stat(path).st_mode & want == want else path
    except OSError:
        return path


def _mode(path: str) -> str:
    try:
        return f"{stat.S_IMODE(os.stat(path).st_mode):04o}"
    except OSError as exc:
        return f"unreadable: {exc.strerror or exc}"


def check_install(rep: Report, cfg: Config, bad: str = FAIL) -> None:
    """Users run seff-gpu with this interpreter and this package: every folder on the way must let them in.
    An interpreter under /root (pyenv's default, mode 0700) installs fine as root and is useless to them."""
    import slurm_gpueff

    places = [("interpreter", os.path.realpath(sys.executable), stat.S_IROTH | stat.S_IXOTH),
              ("venv", sys.executable, stat.S_IXOTH),
              ("package", os.path.dirname(os.path.abspath(slurm_gpueff.__file__)), stat.S_IROTH | stat.S_IXOTH)]
    closed = [(what, where, blocked) for what, where, want in places
              if (blocked := _closed_to_others(where, want)) is not None]
    if not closed:
        rep.add(PASS, "install", f"{sys.executable} and slurm_gpueff usable by every user")
        return
    for what, where, blocked in closed:
        rep.add(bad, f"install {what}", f"{where}: {blocked} is closed to other users (mode {_mode(blocked)}), "
                "so users cannot run seff-gpu: install into a venv made with a system interpreter (e.g. "
                "/usr/bin/python3 -m venv /opt/slurm-gpueff/venv)")


def check_munge(rep: Report, cfg: Config) -> None:
    """A credential from this host's munged: seff-gpu proves who asks with it."""
    from ..access import munge

    try:
        munge.encode(b"gpueff doctor", cfg.service.munge_socket, timeout_s=5.0)
    except munge.MungeError as exc:
        rep.add(FAIL, "munge", f"no credential from munged: {exc}")
        return
    rep.add(PASS, "munge", "munged gives credentials" + (f" ({cfg.service.munge_socket})"
                                                          if cfg.service.munge_socket else ""))


def check_api(rep: Report, cfg: Config, starting_s: float = 0.0) -> None:
    """A sealed round trip with the service's API (``/v1/ping``): it answers, as ``[service] user``, with this
    host's MUNGE key, and its own munged works; what seff-gpu and the forwarder need of it, where
    ``/v1/health`` proves only that something answers HTTP. Nothing listening is asked again for
    ``starting_s`` (a service just started takes a moment to listen)."""
    import json

    from ..access.client import PING_PATH, Impostor, Unreachable, api_url, post_signed

    url = api_url(cfg.service)
    if not url:
        rep.add(FAIL, "api", "no [service] api_url (nor api_listen): seff-gpu here cannot reach the service; set "
                             "api_url to the service host's address, e.g. http://gpueff.example.org:9820")
        return
    deadline = time.monotonic() + starting_s
    while True:
        try:
            reply = post_signed(cfg.service, PING_PATH, b"{}", name="the service")
            break
        except Impostor as exc:
            rep.add(FAIL, "api", str(exc))
            return
        except Unreachable as exc:
            if exc.not_listening and time.monotonic() < deadline:
                time.sleep(0.5)
                continue
            rep.add(FAIL, "api", f"{exc} (is `gpueff serve` running with [service] api_listen?)")
            return
    if not reply.sealed or reply.status != 200:
        rep.add(FAIL, "api", f"{url} refused a sealed round trip: HTTP {reply.status}: {reply.reason()}")
        return
    try:
        said = json.loads(reply.body)
        asked_by = int(said["asked_by"])
    except (ValueError, KeyError, TypeError):
        rep.add(FAIL, "api", f"{url}: the service's answer to a ping cannot be read")
        return
    rep.add(PASS, "api", f"{url}: a sealed round trip with the service (as [service] user = {cfg.service.user}), "
                         f"which knew this host's credential as uid {asked_by}")


def check_tasks(rep: Report, cfg: Config) -> None:
    """``gpueff serve``'s scheduled tasks, as its sealed ``/v1/ping`` answer reports them (``/v1/health`` says
    the same, but anyone on the port could say it): FAIL for a task more than LATE_PERIODS periods late
    (hung, or its schedule lost: a stopped scheduler, a clock step), naming each and by how much; WARN for
    tasks whose last run failed (the service's log says why)."""
    from ..access.client import PING_PATH, Unreachable, api_url, post_signed
    from ..service.taskhealth import LATE_PERIODS, late

    url = api_url(cfg.service)
    if not cfg.service.api_listen or not url:
        rep.add(WARN, "tasks", "no [service] api_listen: the scheduled tasks' state is not readable here "
                               "(/metrics has gpueff_task_late_seconds)")
        return
    try:
        reply = post_signed(cfg.service, PING_PATH, b"{}", name="the service")
        status, answer = reply.status, json.loads(reply.body) if reply.sealed else {}
    except (Unreachable, ValueError) as exc:
        rep.add(FAIL, "tasks", f"the tasks' report cannot be read: {exc}")
        return
    lines = answer.get("tasks") if isinstance(answer, dict) else None
    if not isinstance(lines, list) or not all(isinstance(ln, dict) for ln in lines):
        rep.add(FAIL, "tasks", f"{url}{PING_PATH} answered {status} without the tasks' report: is it `gpueff "
                               "serve` of this version?")
        return
    behind = [ln for ln in lines if late(ln)]
    if behind:
        rep.add(FAIL, "tasks", "; ".join(_late_line(ln) for ln in behind) + f" (more than {LATE_PERIODS} periods: "
                "a task that hangs, or a scheduler that stopped; see the service's log)")
    else:
        steps = int(answer.get("clock_steps") or 0)
        rep.add(PASS, "tasks", f"{len(lines)} scheduled tasks on time: " + ", ".join(_last_run(ln) for ln in lines) + (
            f"; the wall clock stepped {steps} time(s), the last by {answer.get('last_clock_step_s')} s, and the "
            "tasks kept their pace" if steps else ""))
    failed = [ln for ln in lines if ln.get("ok") is False]
    if failed:
        what = "; ".join(f"{ln['task']}'s last run failed ({ln.get('error')}) at {ln.get('last_end')}" for ln in failed)
        rep.add(WARN, "task errors", f"{what}: the service's log says why")


def _last_run(line: dict[str, Any]) -> str:
    """A task's last run in a few words: ``ingest ok 12 s ago``, ``enrich running for 40 s``, ``x not run yet``."""
    if line.get("age_s") is None:
        return f"{line['task']} not run yet"
    if line.get("running"):
        return f"{line['task']} running for {line['age_s']:.0f} s"
    return f"{line['task']} {'ok' if line.get('ok') else 'failed'} {line['age_s']:.0f} s ago"


def _late_line(line: dict[str, Any]) -> str:
    running = f", running for {line['age_s']:.0f} s" if line.get("running") else ""
    last = f"last started {line['age_s']:.0f} s ago" if line.get("age_s") is not None else "never started"
    return (f"{line['task']} late by {line['late_s']:.0f} s ({line['schedule']}; {last}{running})")


def check_api_served(rep: Report, cfg: Config) -> None:
    """On the service host: the API where one is configured (api_listen), and munged with it; right after
    `systemctl enable --now gpueff-serve` the service may still be starting, so it is given a few seconds."""
    if not cfg.service.api_listen:
        rep.add(WARN, "api", "no [service] api_listen: users on other hosts cannot read their cards")
        return
    check_munge(rep, cfg)
    check_api(rep, cfg, starting_s=15.0)


def check_push(rep: Report, cfg: Config) -> None:
    """On a GPU node: ``gpueff forward`` can sign and reach the service, and the node holds no database
    credentials (the push layout needs none; a node that has them can rewrite the site's accounting)."""
    from sqlalchemy.engine import make_url

    from ..access.client import api_url
    from ..storage.dburl import database_url

    url = database_url(cfg.paths.database)
    if not url.startswith("sqlite") and (cfg.paths.database_password_file or make_url(url).password):
        rep.add(WARN, "push credentials", "this node's config names the central database's password: nodes push "
                "through `gpueff forward` and need none; remove paths.database and database_password_file here")
    if not api_url(cfg.service):
        rep.add(WARN, "push", "no [service] api_url: `gpueff forward` cannot push this node's records (fine only "
                              "if the spool is shared with the service host)")
        return
    check_munge(rep, cfg)
    check_api(rep, cfg)


CHECKS: tuple[tuple[str, Callable[[Report, Config], None]], ...] = (
    ("nvml", check_nvml), ("driver ids", check_proc), ("dcgm", check_dcgm), ("backend", check_backend),
    ("agent", check_agent), ("slurm", check_slurm), ("dirs", check_dirs), ("spool", check_spool),
    ("database", check_db), ("metrics", check_metrics),
)

# What each host of a site needs: a GPU node runs the hooks and the agent, the service host ingests and serves,
# a login node only runs seff-gpu against the service. Without a role: CHECKS, every check but the role-only ones.
ROLES: dict[str, tuple[tuple[str, Callable[[Report, Config], None]], ...]] = {
    "node": (("install", check_install), ("nvml", check_nvml), ("driver ids", check_proc), ("dcgm", check_dcgm),
             ("backend", check_backend), ("agent", check_agent), ("agent metrics", check_agent_metrics),
             ("slurm", check_slurm), ("dirs", check_dirs), ("spool", check_spool), ("spool space", check_spool_space),
             ("spool fallback", check_spool_fallback), ("push", check_push), ("forwarder", check_forwarder)),
    "service": (("install", partial(check_install, bad=WARN)), ("dirs", check_dirs), ("spool", check_spool),
                ("database", check_db), ("metrics", check_metrics), ("api", check_api_served),
                ("tasks", check_tasks)),
    "login": (("install", check_install), ("munge", check_munge), ("api", check_api)),
}



def run(cfg: Config, as_json: bool = False, role: str = "all") -> int:
    rep = Report()
    rep.add(PASS, "config", f"{cfg.source}: collector.backend = {cfg.collector.backend!r}")
    for name, check in ROLES.get(role, CHECKS):
        try:
            check(rep, cfg)
        except Exception as exc:  # noqa: BLE001 - a probe that crashes is itself a finding
            rep.add(FAIL, name, f"check crashed: {type(exc).__name__}: {exc}")
    print(rep.as_json() if as_json else rep.text())
    return 1 if rep.count(FAIL) else 0
