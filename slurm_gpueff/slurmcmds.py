"""Small, bounded questions to Slurm's client commands: an array task's or het component's raw job id
(``sacct``) and the account coordinators (``sacctmgr``). Stdlib only; every call has a time limit and
raises :class:`SlurmCommandError` saying why, so a caller can fall back instead of failing.

``sacctmgr`` is looked for beside ``[sacct] command`` when that is an absolute path (a site with Slurm
under /opt/slurm/bin sets it once), else on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

from .errors import GpueffError
from .sacct_rows import raw_id_of

RESOLVE_TIMEOUT_S = 5.0  # seff-gpu waits at most this long for sacct: a user is at the terminal


class SlurmCommandError(GpueffError):
    """A Slurm command is missing, failed or did not answer in time."""


def command_path(sacct_command: str, name: str) -> str | None:
    """``name`` (sacct, sacctmgr, scontrol) beside the configured sacct if that is a path, else on PATH."""
    if os.path.isabs(sacct_command):
        exe = os.path.join(os.path.dirname(sacct_command), name)
        if os.access(exe, os.X_OK):
            return exe
    return shutil.which(name)


def run(exe: str | None, name: str, args: Sequence[str], timeout_s: float) -> str:
    """stdout of ``exe args`` within ``timeout_s``; SlurmCommandError if it is absent, slow or fails."""
    if not exe:
        raise SlurmCommandError(f"{name} not found (not on PATH, nor beside [sacct] command)")
    env = {k: v for k, v in os.environ.items() if k != "SLURM_TIME_FORMAT"}
    try:
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{name} did not answer within {timeout_s:g} s") from None
    except OSError as exc:
        raise SlurmCommandError(f"cannot run {exe}: {exc.strerror or exc}") from None
    if p.returncode != 0:
        msg = (p.stderr or p.stdout).strip().splitlines()
        raise SlurmCommandError(f"{name} failed (exit {p.returncode}): {msg[0] if msg else 'no message'}")
    return p.stdout


def raw_id(spec: str, sacct_command: str, cluster: str | None = None,
           timeout_s: float = RESOLVE_TIMEOUT_S) -> int | None:
    """The raw job id (JobIDRaw) of ``spec`` (``4_0``, ``15+1``) as accounting knows it, in one call; None
    when accounting does not know it.

    The hooks on the nodes see only the raw id (no SLURM_ARRAY_* nor het offset there), so right after
    a task ends its record has no array id until enrichment. JobID is asked too and must equal ``spec``:
    for a task still pending, sacct answers with the array's own record (``4_[0-2]``, raw id 4, which is
    another task once it runs), and that must not be taken for this one (:func:`sacct_rows.raw_id_of`).
    """
    args = ["-X", "-n", "-P", "-o", "JobIDRaw,JobID", "-j", spec] + (["-M", cluster] if cluster else [])
    return raw_id_of(run(command_path(sacct_command, "sacct"), "sacct", args, timeout_s), spec)


def parse_coordinators(text: str) -> dict[str, list[str]]:
    """``{account: [coordinator user, ...]}`` from ``sacctmgr -P show user withcoord [withassoc]``.

    Read by the header (``User`` and ``Coord Accounts``, as in Slurm 22.05 to 26.05), so the extra
    association columns of ``withassoc`` and repeated user lines change nothing; the cell is sacctmgr's
    comma-separated list of accounts the user coordinates, empty for most users.
    """
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines:
        return {}
    head = lines[0].split("|")
    if "User" not in head or "Coord Accounts" not in head:
        raise SlurmCommandError(f"sacctmgr printed no User / Coord Accounts header: {lines[0][:120]!r}")
    iu, ic = head.index("User"), head.index("Coord Accounts")
    out: dict[str, list[str]] = {}
    for line in lines[1:]:
        cells = line.split("|")
        if len(cells) <= max(iu, ic) or not cells[iu]:
            continue
        for account in filter(None, (a.strip() for a in cells[ic].split(","))):
            users = out.setdefault(account, [])
            if cells[iu] not in users:
                users.append(cells[iu])
    return out


def coordinators(sacct_command: str, timeout_s: float) -> dict[str, list[str]]:
    """Every account's coordinators, from one bounded ``sacctmgr`` call; SlurmCommandError if it fails."""
    out = run(command_path(sacct_command, "sacctmgr"), "sacctmgr", ["-P", "show", "user", "withcoord"], timeout_s)
    return parse_coordinators(out)
