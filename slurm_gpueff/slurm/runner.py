"""The one way slurm-gpueff runs Slurm's client commands: sacct, sacctmgr, squeue, scontrol, scancel.

Every call is bounded by a time limit, finds its command the same way, runs it without a shell in a clean
environment, logs in one place (logger ``slurm_gpueff.slurm``, debug: the service and the commands keep
their output unchanged) and fails with one error type, :class:`SlurmCommandError`, that says why in words
and as data, so each caller can fall back or word the advice for its own user. Stdlib only.

A list of job ids is never one argument of unbounded size: Linux refuses to start a program one of whose
arguments is longer than MAX_ARG_STRLEN (32 pages, 128 KiB: about 14,600 ids of 8 digits and their commas)
with E2BIG, "Argument list too long", and a site with 25,000 running jobs passes that. :meth:`SlurmRunner.run_list`
runs a command once per piece of the list (:func:`id_chunks`), each piece a comma-separated argument of at
most :data:`LIST_ARG_BYTES`; callers merge the pieces' answers. A command's output goes to a temporary file,
not a pipe held in memory while it runs, and is refused past :data:`OUTPUT_LIMIT`.

Where the commands are: ``[sacct] command`` names sacct (a bare name is looked up on PATH). A site with
Slurm outside PATH (/opt/slurm/bin) sets it to an absolute path once, and the other commands are then
taken from beside it when they are there, else from PATH.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence

from ..errors import SlurmCommandError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger("slurm_gpueff.slurm")

__all__ = ["LIST_ARG_BYTES", "OUTPUT_LIMIT", "SlurmCommandError", "SlurmRunner", "id_chunks"]

# A list argument's bytes at most: a quarter of Linux's MAX_ARG_STRLEN (128 KiB), so that the rest of argv and
# the environment fit in ARG_MAX beside it too; about 3,600 ids of 8 digits a call.
LIST_ARG_BYTES = 32 * 1024
# A command's output at most (a whole cluster's running jobs from squeue is a few MB; sacct's answers are
# asked in pieces): past it the call fails instead of filling the service's memory.
OUTPUT_LIMIT = 256 * 1024 * 1024


def id_chunks(ids: Iterable[int | str], most: int | None = None, limit: int = LIST_ARG_BYTES) -> list[str]:
    """``ids`` as comma-separated pieces, in order, each of at most ``limit`` bytes and ``most`` ids (None:
    any number); an id longer than ``limit`` is a piece of its own (a job id never is)."""
    out: list[str] = []
    piece: list[str] = []
    size = 0
    for i in map(str, ids):
        n = len(i.encode()) + (1 if piece else 0)
        if piece and (size + n > limit or (most is not None and len(piece) >= most)):
            out.append(",".join(piece))
            piece, size, n = [], 0, len(i.encode())
        piece.append(i)
        size += n
    if piece:
        out.append(",".join(piece))
    return out


class SlurmRunner:
    """Runs Slurm's client commands as configured; ``calls`` counts them (tests check the batching)."""

    def __init__(self, sacct_command: str = "sacct") -> None:
        self.sacct_command = sacct_command
        self.calls = 0

    @classmethod
    def from_config(cls, config: Config) -> SlurmRunner:
        return cls(config.sacct.command)

    def path(self, name: str) -> str | None:
        """The executable of ``name``: sacct as configured (an absolute path that is not executable is
        nowhere: a site that named one means that one); the others beside an absolute sacct, else on PATH.
        None when it is nowhere."""
        configured = self.sacct_command
        if name == "sacct":
            if os.path.isabs(configured):
                return configured if os.access(configured, os.X_OK) else None
            return shutil.which(configured)
        if os.path.isabs(configured):
            exe = os.path.join(os.path.dirname(configured), name)
            if os.access(exe, os.X_OK):
                return exe
        return shutil.which(name)

    def run_list(self, name: str, before: Sequence[str], ids: Iterable[int | str], after: Sequence[str],
                 timeout_s: float, *, most: int | None = None, epoch_times: bool = False) -> list[str]:
        """stdout of ``name *before PIECE *after`` for each piece of ``ids`` (:func:`id_chunks`), in order;
        each call has its own ``timeout_s``. The first failure is raised (the caller decides nothing on part
        of an answer)."""
        return [self.run(name, [*before, piece, *after], timeout_s, epoch_times=epoch_times)
                for piece in id_chunks(ids, most)]

    def run(self, name: str, args: Sequence[str], timeout_s: float, *, epoch_times: bool = False) -> str:
        """stdout of ``name args`` within ``timeout_s``, else :class:`SlurmCommandError`.

        ``epoch_times``: times as epoch seconds (``SLURM_TIME_FORMAT=%s``, for ``sacct -P``); otherwise the
        caller's SLURM_TIME_FORMAT is removed, since it changes what the commands print (and breaks
        ``sacct --json``)."""
        exe = self.path(name)
        if not exe:
            raise self._failed(SlurmCommandError(
                f"{name} not found ({self._where(name)})", why="missing", command=name))
        env = {k: v for k, v in os.environ.items() if k != "SLURM_TIME_FORMAT"}
        if epoch_times:
            env["SLURM_TIME_FORMAT"] = "%s"
        self.calls += 1
        t0 = time.monotonic()
        with tempfile.TemporaryFile() as out:
            try:
                p = subprocess.run([exe, *args], stdout=out, stderr=subprocess.PIPE, timeout=timeout_s, env=env,
                                   check=False)
            except subprocess.TimeoutExpired:
                raise self._failed(SlurmCommandError(f"{name} did not answer within {timeout_s:g} s",
                                                     why="timeout", command=name, exe=exe,
                                                     timeout_s=timeout_s)) from None
            except OSError as exc:
                raise self._failed(SlurmCommandError(f"cannot run {exe}: {exc.strerror or exc}", why="unrunnable",
                                                     command=name, exe=exe, oserror=exc)) from None
            size = out.tell()
            if size > OUTPUT_LIMIT:
                raise self._failed(SlurmCommandError(
                    f"{name} printed {size:,} bytes, more than the {OUTPUT_LIMIT:,} read of one call",
                    why="too much output", command=name, exe=exe))
            out.seek(0)
            stdout = _text(out.read())
        stderr = _text(p.stderr)
        log.debug("%s %s: exit %d in %.2f s", exe, _shown(args), p.returncode, time.monotonic() - t0)
        if p.returncode != 0:
            lines = (stderr or stdout).strip().splitlines()
            first = lines[0] if lines else "no message"
            raise self._failed(SlurmCommandError(f"{name} failed (exit {p.returncode}): {first}", why="failed",
                                                 command=name, exe=exe, returncode=p.returncode, first_line=first))
        return stdout

    def _where(self, name: str) -> str:
        if name == "sacct" and os.path.isabs(self.sacct_command):
            return f"[sacct] command = {self.sacct_command} is not an executable file"
        return "not on PATH, nor beside [sacct] command"

    @staticmethod
    def _failed(exc: SlurmCommandError) -> SlurmCommandError:
        log.debug("%s", exc)
        return exc


def _shown(args: Sequence[str]) -> str:
    """The arguments for the debug log, a long id list cut (a piece is up to 32 KiB)."""
    return " ".join(a if len(a) <= 200 else f"{a[:60]}...({len(a):,} bytes)" for a in args)


def _text(raw: bytes) -> str:
    """A command's output as text: UTF-8 (a byte that is not becomes U+FFFD, never an exception) with its line
    ends as text mode reads them (``\r\n`` and ``\r`` are ``\n``)."""
    return raw.decode(errors="replace").replace("\r\n", "\n").replace("\r", "\n")
