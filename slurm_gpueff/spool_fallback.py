"""Where the Epilog puts a record when the spool is unwritable, and how such records get back.

A finished job's record is never dropped: if the configured spool cannot be written, the record goes to
the first writable fallback of ``<state_dir>/spool-fallback``, ``$TMPDIR``, ``/var/tmp`` and ``/tmp``
(``.../slurm-gpueff-spool-fallback`` for the temp dirs). Fallbacks must be private directories owned by
us: world-writable /tmp could hold someone else's. They are node-local, so ingest (often on another
host) cannot see them: the next Epilog on the node that writes to the real spool drains them back into
it. Stdlib only (hook path).
"""

from __future__ import annotations

import os
import stat

from . import spool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .config import Config

    Log = Callable[[str, str], None]  # (level, message), as hook.HookLog

FALLBACK_NAME = "slurm-gpueff-spool-fallback"


def spool_dirs(cfg: Config, env: Mapping[str, str]) -> list[str]:
    """The configured spool, then the fallbacks in the order the hook tries them."""
    out = [cfg.paths.spool_dir, os.path.join(cfg.paths.state_dir, "spool-fallback")]
    for base in (env.get("TMPDIR"), "/var/tmp", "/tmp"):
        if base and os.path.isabs(base):
            out.append(os.path.join(base, FALLBACK_NAME))
    return list(dict.fromkeys(out))


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


def write(cfg: Config, env: Mapping[str, str], name: str, data: bytes, log: Log,
          sub: str = spool.INCOMING) -> tuple[str | None, bool]:
    """Write ``data`` as ``<spool>/<sub>/<name>``, else into the first fallback that works; return (its
    path or None, whether that is the configured spool)."""
    errors: list[str] = []
    dirs = spool_dirs(cfg, env)
    for i, d in enumerate(dirs):
        try:
            if i and not private_dir(d, create=True):
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


def drain(cfg: Config, env: Mapping[str, str], log: Log) -> int:
    """Move records stranded in fallback spools back into the configured spool; return how many.

    Copy + fsync into ``incoming/`` then unlink (fallbacks may be on another filesystem). If the spool
    already holds a record for the same job and node, the stranded (older) one goes to ``quarantine/``
    with an ``.error`` note instead of overwriting it: nothing is lost, nothing newer is clobbered.
    """
    primary = cfg.paths.spool_dir
    moved = 0
    for d in spool_dirs(cfg, env)[1:]:
        if not private_dir(d, create=False):
            continue
        for sub in (spool.INCOMING, spool.QUARANTINE):
            for src in _files(os.path.join(d, sub)):
                name = os.path.basename(src)
                try:
                    # never through a link, never a FIFO's wait: a regular file of the fallback's own
                    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                    with os.fdopen(fd, "rb") as fh:
                        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                            continue
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
        return sorted(e.path for e in os.scandir(d) if e.is_file(follow_symlinks=False) and not e.name.startswith("."))
    except OSError:
        return []
