"""The one way slurm-gpueff runs Slurm's client commands: sacct, sacctmgr, squeue, scontrol, scancel.

Every call is bounded by a time limit, finds its command the same way, runs it without a shell in a clean
environment, logs in one place (logger ``slurm_gpueff.slurm``, debug: the service and the commands keep
their output unchanged) and fails with one error type, :class:`SlurmCommandError`, that says why in words
and as data, so each caller can fall back or word the advice for its own user. Stdlib only.

Where the commands are: ``[sacct] command`` names sacct (a bare name is looked up on PATH). A site with
Slurm outside PATH (/opt/slurm/bin) sets it to an absolute path once, and the other commands are then
taken from beside it when they are there, else from PATH.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Sequence

from ..errors import SlurmCommandError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..config import Config

log = logging.getLogger("slurm_gpueff.slurm")

__all__ = ["SlurmCommandError", "SlurmRunner"]


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
        try:
            p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s, env=env,
                               check=False)
        except subprocess.TimeoutExpired:
            raise self._failed(SlurmCommandError(f"{name} did not answer within {timeout_s:g} s", why="timeout",
                                                 command=name, exe=exe, timeout_s=timeout_s)) from None
        except OSError as exc:
            raise self._failed(SlurmCommandError(f"cannot run {exe}: {exc.strerror or exc}", why="unrunnable",
                                                 command=name, exe=exe, oserror=exc)) from None
        log.debug("%s %s: exit %d in %.2f s", exe, " ".join(args), p.returncode, time.monotonic() - t0)
        if p.returncode != 0:
            lines = (p.stderr or p.stdout).strip().splitlines()
            first = lines[0] if lines else "no message"
            raise self._failed(SlurmCommandError(f"{name} failed (exit {p.returncode}): {first}", why="failed",
                                                 command=name, exe=exe, returncode=p.returncode, first_line=first))
        return p.stdout

    def _where(self, name: str) -> str:
        if name == "sacct" and os.path.isabs(self.sacct_command):
            return f"[sacct] command = {self.sacct_command} is not an executable file"
        return "not on PATH, nor beside [sacct] command"

    @staticmethod
    def _failed(exc: SlurmCommandError) -> SlurmCommandError:
        log.debug("%s", exc)
        return exc
