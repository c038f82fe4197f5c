"""A process in a mount namespace of its own (``unshare -m``, root), for the node's fault tests.

Inside it, and nowhere else (the namespace's mounts are private and die with its last process):
- ``/dev`` is a fresh tmpfs holding the usual device nodes (bind mounts of the real ones) and ``/dev/log``,
  a bind mount of a datagram socket that the test binds and reads (:class:`SyslogSocket`): the process's
  syslog(3) talks to it exactly as to journald or rsyslogd on a node, which this machine does not run;
- the directories named in ``tmpfs`` are hidden under a fresh tmpfs (``/tmp``, ``/var/tmp``, a state dir), so
  a test decides which places a reboot would empty; ``ro`` ones under a read-only tmpfs (nothing can be
  written there). A hidden directory above the test's own ``base``, the checkout or the venv (all may be
  under ``/tmp``, as in CI's fresh clone) keeps them reachable: each is bound aside first and back into the
  new tmpfs.
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time

DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
# What the process runs from stays reachable under a hidden /tmp: the checkout (hooks/, the package; CI clones
# it under /tmp) and the interpreter's environment.
KEEP = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sys.prefix)
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"  # for the prelude's own commands; not exported to the process


def unusable() -> str | None:
    """Why a namespace cannot be made here (a skip reason), or None."""
    if os.geteuid() != 0:
        return "needs root (mount namespaces)"
    if not shutil.which("unshare"):
        return "no unshare"
    p = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True)
    return None if p.returncode == 0 else f"unshare -m fails: {p.stderr.strip()}"


class SyslogSocket:
    """A datagram socket standing in for the syslog daemon's /dev/log; ``lines()`` are the messages that came."""

    def __init__(self, path: str):
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.got: list[str] = []

    def lines(self, settle_s: float = 0.3) -> list[str]:
        """Everything received so far (waiting ``settle_s`` for more after the last one)."""
        self.sock.settimeout(settle_s)
        while True:
            try:
                self.got.append(self.sock.recv(1 << 20).decode(errors="replace"))
            except TimeoutError:
                return list(self.got)

    def fill(self) -> int:
        """Fill its queue, as a syslog daemon that stopped reading leaves it: the next sender blocks."""
        c = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        c.connect(self.path)
        c.setblocking(False)
        n = 0
        try:
            while True:
                c.send(b"<30>filler")
                n += 1
        except BlockingIOError:
            pass
        c.close()
        return n

    def close(self) -> None:
        self.sock.close()
        os.unlink(self.path)


def prelude(base: str, devlog: str | None, tmpfs: tuple[str, ...] = (), ro: tuple[str, ...] = ()) -> str:
    """The shell script that sets the namespace up, then execs its arguments with stderr closed unless
    ``$NS_STDERR`` is set (slurmd may keep no hook stderr at all)."""
    q = shlex.quote
    olddev = os.path.join(base, ".ns-olddev")
    os.makedirs(olddev, exist_ok=True)
    lines = ["set -e", f"PATH={_PATH}", "mount --make-rprivate /", f"mount --bind /dev {q(olddev)}",
             "mount -t tmpfs -o mode=755 ns-dev /dev"]
    for n in DEVICES:
        lines.append(f"if [ -e {q(olddev)}/{n} ]; then touch /dev/{n}; mount --bind {q(olddev)}/{n} /dev/{n}; fi")
    lines.append("ln -s /proc/self/fd /dev/fd")
    if devlog:
        lines.append(f"touch /dev/log; mount --bind {q(devlog)} /dev/log")
    keep = _outermost([base, *KEEP])
    for d, opts in [*((d, "mode=755") for d in tmpfs), *((d, "ro,mode=755") for d in ro)]:
        inside = [k for k in keep if (k + "/").startswith(d.rstrip("/") + "/")]
        if inside and "ro" in opts.split(","):
            raise ValueError(f"{d} holds {inside[0]}, which the process needs: it cannot be read-only")
        for i, k in enumerate(inside):  # keep the test's files, the checkout and the venv reachable
            lines += [f"mkdir -p /dev/.keep{i}", f"mount --rbind {q(k)} /dev/.keep{i}"]
        lines.append(f"mkdir -p {q(d)}; mount -t tmpfs -o {opts} ns-tmp {q(d)}")
        for i, k in enumerate(inside):
            lines += [f"mkdir -p {q(k)}", f"mount --rbind /dev/.keep{i} {q(k)}", f"umount -l /dev/.keep{i}"]
    lines.append('if [ -n "$NS_STDERR" ]; then exec "$@"; else exec "$@" 2>&-; fi')
    return "\n".join(lines)


def _outermost(paths: list[str]) -> list[str]:
    """The paths not inside another of them (binding the outer one keeps the inner one too)."""
    real = sorted({os.path.realpath(p) for p in paths})
    return [p for p in real if not any(p != o and (p + "/").startswith(o + "/") for o in real)]


def run(argv: list[str], *, base: str, devlog: str | None, env: dict[str, str], tmpfs: tuple[str, ...] = (),
        ro: tuple[str, ...] = (), cwd: str | None = None, timeout: float = 60,
        keep_stderr: bool = False) -> tuple[subprocess.CompletedProcess[str], float]:
    """``argv`` in a namespace of its own (see the module docstring); (the process, wall seconds)."""
    script = prelude(base, devlog, tmpfs, ro)
    e = dict(env, NS_STDERR="1") if keep_stderr else dict(env)
    t = time.monotonic()
    unshare = shutil.which("unshare") or "unshare"
    p = subprocess.run([unshare, "-m", "/bin/sh", "-c", script, "sh", *argv], env=e, cwd=cwd, capture_output=True,
                       text=True, timeout=timeout)
    return p, time.monotonic() - t
