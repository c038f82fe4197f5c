"""Which Slurm job a GPU process belongs to: its cgroup, else its environment, never a guess.

Slurm's cgroup plugins put every task of a job under a ``job_<raw id>`` directory below a Slurm directory:
cgroup v1 ``/slurm/uid_<uid>/job_<id>/step_<step>/task_<n>`` (``/slurm_<node>/...`` with several slurmd
on a host), cgroup v2 ``/system.slice/slurmstepd.scope/job_<id>/step_<step>/user/task_<n>``
(``<node>_slurmstepd.scope`` likewise). The job id is the raw one, which is also what a hook's job file is
named by. So a ``job_<digits>`` component below any component naming Slurm is the job, on either version;
a user cannot move their process out of it (the sub-hierarchy is delegated to slurmstepd, not to them).

Without a Slurm cgroup (``proctrack/linuxproc``, containers with a flat cgroup), the process's own
``SLURM_JOB_ID`` is used, but only when the process's real uid is the job's user: anyone can set the
variable, and a process must never move its GPU time onto another user's job. A process that neither maps
is *unattributed*, and so is one that exited before it was looked at. Mapped processes are cached per
(pid, start time), so a reused pid is looked at afresh.
"""

from __future__ import annotations

import os
import pwd
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

_JOB = re.compile(r"job_([0-9]{1,10})")
_ENV = re.compile(rb"(?:^|\0)SLURM_JOB_ID=(\d{1,10})(?:\0|$)")
CACHE_MAX = 4096
MPS_SERVER = "nvidia-cuda-mps"  # nvidia-cuda-mps-server as /proc/PID/comm holds it (15 characters); of the
# two MPS daemons only the server has a GPU context, so a GPU process of that name is the server
MPS_WHY = "the MPS server: NVML credits every MPS client's kernels to it"


def job_of_cgroup(text: str) -> str | None:
    """The Slurm job id in a ``/proc/PID/cgroup`` text, or None when no line is a Slurm job's cgroup."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        slurm_seen = False
        for part in path.split("/"):
            if slurm_seen:
                m = _JOB.fullmatch(part)
                if m:
                    return str(int(m.group(1)))
            elif "slurm" in part:
                slurm_seen = True
    return None


def job_of_environ(data: bytes) -> str | None:
    """``SLURM_JOB_ID`` of a ``/proc/PID/environ`` (NUL-separated), or None."""
    m = _ENV.search(data)
    return str(int(m.group(1))) if m else None


@dataclass(frozen=True)
class Owner:
    """How a process was mapped: ``job`` (None: unattributed) and ``how`` (``cgroup``, ``environment``,
    or why not)."""

    job: str | None
    how: str
    mps_server: bool = False  # NVML's per-process utilization of MPS clients all lands on this process


class ProcessJobs:
    """Maps pids to the running jobs' ids. ``proc`` is /proc (a test gives a stand-in tree); ``job_users``
    (job id -> user name) is what the node's job files say, refreshed by the agent each tick."""

    def __init__(self, proc: str = "/proc", uid_of: Callable[[str], int | None] | None = None) -> None:
        self.proc = proc
        self.uid_of = uid_of or _uid_of_user
        self._cache: dict[tuple[int, str], Owner] = {}

    def owner(self, pid: int, job_users: Mapping[str, str]) -> Owner:
        """The job ``pid`` runs for, if it is one of ``job_users``' jobs."""
        base = os.path.join(self.proc, str(pid))
        try:
            with open(os.path.join(base, "stat"), "rb") as fh:
                stat = fh.read()
        except OSError:
            return Owner(None, "the process exited before it could be looked at")
        start = stat.rsplit(b")", 1)[-1].split()[19:20]  # field 22, counted after the command name
        key = (pid, start[0].decode() if start else "")
        hit = self._cache.get(key)
        if hit is not None and hit.job in job_users:
            return hit
        found = self._look(base, job_users)
        if found.job is not None:  # an unmapped process is looked at again: its job may start later
            if len(self._cache) >= CACHE_MAX:
                self._cache.clear()
            self._cache[key] = found
        return found

    def _look(self, base: str, job_users: Mapping[str, str]) -> Owner:
        try:
            with open(os.path.join(base, "comm")) as fh:
                if fh.read().strip().startswith(MPS_SERVER):
                    return Owner(None, MPS_WHY, mps_server=True)
        except OSError:
            pass
        try:
            with open(os.path.join(base, "cgroup")) as fh:
                job = job_of_cgroup(fh.read())
        except OSError:
            job = None
        if job is not None:
            return Owner(job, "cgroup") if job in job_users else Owner(None, f"Slurm job {job}, not running here")
        try:
            with open(os.path.join(base, "environ"), "rb") as fh:
                job = job_of_environ(fh.read())
            uid = os.stat(base).st_uid
        except OSError:
            return Owner(None, "neither a Slurm cgroup nor a readable environment")
        if job is None:
            return Owner(None, "no Slurm job: not in a Slurm cgroup and no SLURM_JOB_ID")
        user = job_users.get(job)
        if user is None:
            return Owner(None, f"SLURM_JOB_ID={job}, a job not running here")
        if self.uid_of(user) != uid:
            return Owner(None, f"SLURM_JOB_ID={job}, but the process is not {user}'s")
        return Owner(job, "environment")


def _uid_of_user(name: str) -> int | None:
    try:
        return pwd.getpwnam(name).pw_uid
    except (KeyError, OSError):
        return None
