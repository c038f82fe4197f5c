"""The durable spool: where a finished job's record waits until the database has it.

Layout under ``paths.spool_dir``::

    incoming/    job-<job_id>-<node>.json   one per job and node; written atomically; a requeued job's
                 job-<job_id>-r<run>[p<time>]-<node>.json  later runs (p: run not settled, docs/DESIGN.md "Runs")
    quarantine/  <name> + <name>.error      what ingest would not take, with the reason: records it could not
                                            read, and entries it does not trust (access/spool_trust.py)
    .tmp-*       half-written files (never read; cleaned up by ingest when old)

Writes are temp file + fsync + rename + directory fsync, mode 0600 in 0700 directories (records name
users and accounts). Stdlib only (hook path).

A finished job's record is never dropped: if the configured spool cannot be written (full, read-only,
gone), the record goes to the first writable fallback (:func:`ranked_fallbacks`) of ``paths.spool_fallback_dir``,
``<state_dir>/spool-fallback``, ``$TMPDIR``, ``/var/tmp`` and ``/tmp`` (``.../slurm-gpueff-spool-fallback`` for
the temp dirs): persistent places on another filesystem than the spool's first (a full spool filesystem
fills the others too), then persistent ones on the spool's, and a tmpfs (``/run``: lost at a reboot) only
as the last resort, said so in the Epilog's log line. Fallbacks must be private directories owned by us:
world-writable /tmp could hold someone else's. They are node-local, so ingest (often on another host)
cannot see them: ``gpueff forward`` sends them from there (node/push.py), and the next Epilog on the node
that writes to the real spool, or a forwarder's pass that can, moves them back (:func:`drain_fallbacks`);
``gpueff doctor --role node`` FAILs while any wait.
"""

from __future__ import annotations

import os
import re
import stat
import time

from . import statedir
from .record import encode

TYPE_CHECKING = False  # typing, for annotations only, would slow every Prolog/Epilog's start-up
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping
    from typing import Any

    from .config import Config

    Log = Callable[[str, str], None]  # (level, message), as hook.HookLog

INCOMING = "incoming"
QUARANTINE = "quarantine"
ERROR = ".error"  # beside a quarantined entry: why
STALE_TMP_S = 3600.0  # a temp file this old was left by a writer that died
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
# What record_name makes: the only names ingest and the service take (anything else is quarantined).
RECORD_NAME = re.compile(r"job-[0-9]+-[A-Za-z0-9_.~-]+\.json")
FALLBACK_NAME = "slurm-gpueff-spool-fallback"


def incoming_dir(spool_dir: str) -> str:
    """Where records wait for ingest."""
    return os.path.join(spool_dir, INCOMING)


def quarantine_dir(spool_dir: str) -> str:
    """Where what ingest would not take waits for a person, each with its ``.error``."""
    return os.path.join(spool_dir, QUARANTINE)


def record_name(job_id: int, node: str, run: str = "") -> str:
    """The file name of a job's record on a node (node names are sanitised, never a path); ``run`` from
    :func:`run_tag` (empty for a job's first run)."""
    return f"job-{int(job_id)}-{run + '-' if run else ''}{_SAFE.sub('_', node) or 'node'}.json"


def run_tag(rec: dict[str, Any]) -> str:
    """``""`` for run 0, ``r<run>`` for a later run, ``r<count>p<start s | end ms>`` for a run the Epilog could
    not settle (two runs may carry the same provisional count; their start, else end, times tell them apart)."""
    run = rec.get("run") or 0
    if rec.get("run_provisional"):
        start = rec.get("start_time")
        return f"r{int(run)}p{int(start) if start else int(rec['end_time'] * 1000)}"
    return f"r{int(run)}" if run else ""


def live_tag(rec: dict[str, Any]) -> str:
    """The run tag of a running job's live record: ``r<run>~live``. ``~`` never occurs in a sanitised node
    name, so a live file never takes a final record's name; each new snapshot replaces the last one."""
    return f"r{int(rec.get('run') or 0)}~live"


def ensure_dirs(spool_dir: str) -> None:
    for d in (spool_dir, incoming_dir(spool_dir), quarantine_dir(spool_dir)):
        os.makedirs(d, mode=0o700, exist_ok=True)  # one at a time: makedirs gives only the leaf its mode


def atomic_write(path: str, data: bytes, mode: int = 0o600, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the whole new one, never a part.

    ``durable=False`` skips both fsyncs: for files whose content means nothing after a crash or reboot
    (the agent's state), where they would only make every write dear.
    """
    directory = os.path.dirname(path) or "."
    # Not tempfile.mkstemp: importing tempfile (shutil, random, bz2, lzma) would slow the hook's start-up.
    tmp = os.path.join(directory, f".tmp-{os.getpid()}-{os.urandom(6).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if durable:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:  # noqa: SIM105 - contextlib would be one more import on the hook path
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if not durable:
        return
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def record_path(spool_dir: str, record: dict[str, Any]) -> str:
    """Where a record goes in ``incoming/``: a final record by its run, a running job's by :func:`live_tag`."""
    tag = live_tag(record) if record.get("live") is True else run_tag(record)
    return os.path.join(incoming_dir(spool_dir), record_name(record["job_id"], record["node"], tag))


def write_record(spool_dir: str, record: dict[str, Any], *, durable: bool = True) -> str:
    """Write one record into ``incoming/`` (its bytes: :func:`record.encode`); return its path. ``durable``
    False skips the fsyncs, for a running job's live record that the next one replaces anyway."""
    ensure_dirs(spool_dir)
    path = record_path(spool_dir, record)
    atomic_write(path, encode(record), durable=durable)
    return path


def pending(spool_dir: str, stale_tmp_s: float | None = None) -> Iterator[str]:
    """Paths of records waiting in ``incoming/``, oldest first; with ``stale_tmp_s``, temp files older
    than that (left by a writer that died) are removed in the same pass."""
    d = incoming_dir(spool_dir)
    prefix = d + os.sep
    for name in _by_arrival(d, _listing(d, stale_tmp_s)):
        yield prefix + name


def job_of(name: str) -> str | None:
    """The job id in a record's file name (``job-<id>-<node>.json``), None for a file named otherwise."""
    parts = name.split("-", 2)
    return parts[1] if len(parts) == 3 and parts[0] == "job" else None


def group_by_job(paths: list[str]) -> list[list[str]]:
    """``paths`` as groups of one job's node records, in their order; groups in order of first appearance.
    A file named otherwise (:func:`job_of`) is a group of its own."""
    by_job: dict[str, list[str]] = {}
    sep = os.sep
    for p in paths:
        key = job_of(p[p.rfind(sep) + 1:])  # the base name, without os.path's per-call overhead
        by_job.setdefault(p if key is None else key, []).append(p)
    return list(by_job.values())


def pending_by_job(spool_dir: str, stale_tmp_s: float | None = None) -> list[list[str]]:
    """Records waiting in ``incoming/`` as groups of one job's node records (:func:`group_by_job`).

    Within a group, arrival order (mtime, then name): ingest merges a job's records "latest wins". Between
    jobs no order changes the outcome, so only jobs with several files are ``stat``-ed and the groups come
    in job id order (neighbouring ids go into the indexes together), files named otherwise last.
    """
    d = incoming_dir(spool_dir)
    by_job: dict[str, list[str]] = {}
    for name in _listing(d, stale_tmp_s):  # job_of, inline: this loop and the one below run per file
        parts = name.split("-", 2)
        by_job.setdefault(parts[1] if len(parts) == 3 and parts[0] == "job" else name, []).append(name)
    ids = [k for k in by_job if k.isascii() and k.isdigit()]  # a job's files (another script's digits: named otherwise)
    ids.sort(key=int)
    if len(ids) < len(by_job):  # files named otherwise, last
        ids += sorted(k for k in by_job if not (k.isascii() and k.isdigit()))
    prefix = d + os.sep
    out = []
    for key in ids:
        group = by_job[key]
        out.append([prefix + group[0]] if len(group) == 1 else [prefix + n for n in _by_arrival(d, group)])
    return out


def _listing(d: str, stale_tmp_s: float | None) -> list[str]:
    """Names of the entries in ``d`` but hidden ones (whatever their kind: ingest decides what it trusts and
    quarantines the rest, so nothing sits there unseen); stale temp files removed on the way."""
    names: list[str] = []
    try:
        with os.scandir(d) as it:
            for e in it:
                name = e.name
                if name.startswith("."):
                    if stale_tmp_s is not None and name.startswith(".tmp-"):
                        _remove_if_stale(e.path, stale_tmp_s)
                else:
                    names.append(name)
    except FileNotFoundError:
        pass
    return names


def _by_arrival(d: str, names: list[str]) -> list[str]:
    """``names`` (files in ``d``) oldest first; files gone since the listing are left out."""
    keyed = []
    prefix = d + os.sep
    for name in names:
        try:
            keyed.append((os.lstat(prefix + name).st_mtime, name))
        except FileNotFoundError:  # taken by a concurrent ingest/forwarder since the listing
            continue
    keyed.sort()
    return [name for _mtime, name in keyed]


def _remove_if_stale(path: str, older_than_s: float) -> None:
    try:
        if time.time() - os.lstat(path).st_mtime > older_than_s:
            os.unlink(path)
    except FileNotFoundError:
        pass


def quarantine(spool_dir: str, path: str, error: str) -> str:
    """Move a bad record aside with a ``.error`` file beside it; never delete it. The entry itself is renamed
    (a symbolic link stays a link, a FIFO a FIFO): nothing is followed, opened or copied."""
    ensure_dirs(spool_dir)
    qdir = quarantine_dir(spool_dir)
    base = os.path.basename(path)
    dest = os.path.join(qdir, base)
    if os.path.lexists(dest) or os.path.lexists(dest + ERROR):
        dest = os.path.join(qdir, f"{int(time.time())}-{base}")
    os.replace(path, dest)
    atomic_write(dest + ERROR, (error.rstrip() + "\n").encode())
    return dest

def quarantine_data(spool_dir: str, name: str, data: bytes, error: str) -> str:
    """Keep a record that arrived over the network and was refused, with its ``.error``, in ``quarantine/``
    under a new name (``name`` is the sender's, so only its safe characters are kept)."""
    ensure_dirs(spool_dir)
    base = f"{time.time_ns()}-{_SAFE.sub('_', name)[:160] or 'record'}"
    dest = os.path.join(quarantine_dir(spool_dir), base)
    atomic_write(dest, data)
    atomic_write(dest + ERROR, (error.rstrip() + "\n").encode())
    return dest


def fallback_dirs(cfg: Config, env: Mapping[str, str]) -> list[str]:
    """The fallback spools in the order written (:func:`ranked_fallbacks` is the order they are tried in)."""
    out = [cfg.paths.spool_fallback_dir] if cfg.paths.spool_fallback_dir else []
    out.append(statedir.spool_fallback(cfg.paths.state_dir))
    for base in (env.get("TMPDIR"), "/var/tmp", "/tmp"):
        if base and os.path.isabs(base):
            out.append(os.path.join(base, FALLBACK_NAME))
    primary = os.path.normpath(cfg.paths.spool_dir)
    return [d for d in dict.fromkeys(out) if os.path.normpath(d) != primary]


def spool_dirs(cfg: Config, env: Mapping[str, str]) -> list[str]:
    """The configured spool, then the fallbacks."""
    return [cfg.paths.spool_dir, *fallback_dirs(cfg, env)]


VOLATILE_FS = frozenset({"tmpfs", "ramfs"})  # what a reboot empties
NOT_PERSISTENT = "not persistent: lost on reboot"


def _mounts() -> dict[str, str]:
    """Filesystem type by device (``major:minor``) from /proc/self/mountinfo; empty where it cannot be read.
    Not statfs(2)'s f_type: Python has no statfs, and ctypes would need each architecture's struct layout."""
    out: dict[str, str] = {}
    try:
        with open("/proc/self/mountinfo", "rb") as fh:
            text = fh.read().decode(errors="replace")
    except OSError:
        return out
    for line in text.splitlines():
        fields, sep, rest = line.partition(" - ")
        parts = fields.split(" ")
        if sep and len(parts) > 2:
            out.setdefault(parts[2], rest.split(" ", 1)[0])
    return out


def filesystem(path: str, mounts: dict[str, str] | None = None) -> tuple[int | None, str | None]:
    """(device, filesystem type) of what holds ``path`` or, while it does not exist, its nearest existing
    parent; None for what cannot be found out."""
    p = os.path.abspath(path)
    while True:
        try:
            dev = os.stat(p).st_dev
            break
        except OSError:
            parent = os.path.dirname(p)
            if parent == p:
                return None, None
            p = parent
    kinds = _mounts() if mounts is None else mounts
    return dev, kinds.get(f"{os.major(dev)}:{os.minor(dev)}")


def volatile(path: str, mounts: dict[str, str] | None = None) -> bool:
    """Whether ``path`` is (or would be made) on a filesystem that a reboot empties (tmpfs, ramfs)."""
    return filesystem(path, mounts)[1] in VOLATILE_FS


def ranked_fallbacks(cfg: Config, env: Mapping[str, str]) -> list[tuple[str, bool]]:
    """(fallback dir, volatile) in the order the Epilog tries them: persistent ones on another filesystem than
    the spool's, then persistent ones on the spool's, then tmpfs ones (a reboot loses what they hold); the
    written order (:func:`fallback_dirs`) within each."""
    mounts = _mounts()
    spool_dev = filesystem(cfg.paths.spool_dir, mounts)[0]
    ranked = []
    for i, d in enumerate(fallback_dirs(cfg, env)):
        dev, kind = filesystem(d, mounts)
        vol = kind in VOLATILE_FS
        ranked.append((2 if vol else int(dev is not None and dev == spool_dev), i, d, vol))
    ranked.sort()
    return [(d, vol) for _rank, _i, d, vol in ranked]


def waiting(d: str) -> tuple[int, int]:
    """(records in ``incoming/``, entries in ``quarantine/`` without their ``.error``) of a fallback spool
    of ours; (0, 0) for one that is not (:func:`private_dir`): the Epilog never wrote there."""
    if not private_dir(d, create=False):
        return 0, 0
    q = _listing(quarantine_dir(d), None)  # entries of any kind: a planted link needs a person too
    return len(_listing(incoming_dir(d), None)), sum(1 for n in q if not n.endswith(ERROR))


def private_dir(path: str, create: bool) -> bool:
    """True if ``path`` is (now) a real directory owned by us and closed to others (0700); a directory
    someone else made, or a symlink, is refused."""
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


def write_with_fallback(cfg: Config, env: Mapping[str, str], name: str, data: bytes, log: Log,
          sub: str = INCOMING) -> tuple[str | None, bool]:
    """Write ``data`` as ``<spool>/<sub>/<name>``, else into the first fallback that works
    (:func:`ranked_fallbacks`); return (its path or None, whether that is the configured spool)."""
    primary = cfg.paths.spool_dir
    try:
        ensure_dirs(primary)
        path = os.path.join(primary, sub, name)
        atomic_write(path, data)
        return path, True
    except OSError as exc:
        errors = [f"{primary}: {exc}"]
    for d, vol in ranked_fallbacks(cfg, env):
        try:
            if not private_dir(d, create=True):
                raise OSError(f"not a private directory owned by uid {os.geteuid()}")
            ensure_dirs(d)
            path = os.path.join(d, sub, name)
            atomic_write(path, data)
        except OSError as exc:
            errors.append(f"{d}: {exc}")
            continue
        log("error", f"spool {primary} is not writable ({errors[0]}); wrote {path} instead ("
                     + (f"{NOT_PERSISTENT}; set paths.spool_fallback_dir to persistent storage" if vol
                        else "persistent storage")
                     + ("). `gpueff forward` sends it from there, and the next job end on this node that can "
                        "write the spool moves it back" if sub == INCOMING else "). The next job end on this node "
                        "that can write the spool, or `gpueff forward`, moves it back"))
        return path, False
    log("error", "could not write the job record anywhere (" + "; ".join(errors) + "); record follows: "
        + data.decode(errors="replace"))
    return None, False


def drain_fallbacks(cfg: Config, env: Mapping[str, str], log: Log) -> int:
    """Move records stranded in fallback spools back into the configured spool; return how many.

    Copy + fsync into ``incoming/`` then unlink (fallbacks may be on another filesystem). If the spool
    already holds a record for the same job and node, the stranded (older) one goes to ``quarantine/``
    with an ``.error`` note instead of overwriting it (nothing is lost, nothing newer is clobbered), unless
    it is the same bytes: a copy whose move was cut short, only unlinked. The first write the spool refuses
    (still full) ends the drain: what is left waits for the next one.
    """
    primary = cfg.paths.spool_dir
    moved = 0
    for d in fallback_dirs(cfg, env):
        if not private_dir(d, create=False):
            continue
        for sub in (INCOMING, QUARANTINE):
            for src in _fallback_files(os.path.join(d, sub)):
                name = os.path.basename(src)
                try:
                    # never through a link, never a FIFO's wait: a regular file of the fallback's own
                    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                    with os.fdopen(fd, "rb") as fh:
                        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                            continue
                        data = fh.read()
                except OSError as exc:
                    log("warning", f"cannot move {src} back into {primary}: {exc}")
                    continue
                dest = os.path.join(primary, sub, name)
                try:
                    ensure_dirs(primary)
                    if sub == INCOMING and _same(dest, data):
                        os.unlink(src)
                        continue
                    if sub == INCOMING and os.path.lexists(dest):
                        dest = os.path.join(quarantine_dir(primary), f"fallback-{name}")
                        atomic_write(dest + ERROR, (
                            f"stranded in fallback spool {d}; a newer record for the same job and node "
                            "was already in incoming/\n").encode())
                    atomic_write(dest, data)
                except OSError as exc:
                    log("warning", f"cannot move {src} back into {primary} ({exc}); "
                                   f"{moved} record(s) moved back, the rest wait")
                    return moved
                try:
                    os.unlink(src)
                except FileNotFoundError:  # moved or sent meanwhile by a concurrent Epilog or forwarder
                    pass
                except OSError as exc:
                    log("warning", f"moved {src} back into {primary} but cannot remove it: {exc}")
                moved += 1
    if moved:
        log("warning", f"moved {moved} record(s) from fallback spools back into {primary}")
    return moved


def _same(path: str, data: bytes) -> bool:
    """Whether ``path`` is a regular file holding exactly ``data`` (read without following a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        return stat.S_ISREG(st.st_mode) and st.st_size == len(data) and fh.read(len(data) + 1) == data


def _fallback_files(d: str) -> list[str]:
    try:
        return sorted(e.path for e in os.scandir(d) if e.is_file(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return []
