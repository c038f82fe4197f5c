"""Slurm's answers to the small questions slurm-gpueff asks, each in one bounded call through
:class:`.runner.SlurmRunner`: an array task's or het component's raw job id (``sacct``), the account
coordinators (``sacctmgr``), the running jobs as ``squeue`` shows them, the Prolog/Epilog settings and
what ``PrivateData`` hides (``scontrol show config``), and the two actions of the idle-GPU policy
(``scontrol update`` of the AdminComment, ``scancel``). Each raises :class:`SlurmCommandError` saying why,
so a caller can fall back instead of failing; the parsers are apart from the calls, for the captured outputs
of every Slurm version. Stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, NamedTuple

from .jobid import is_digits
from .runner import SlurmCommandError, SlurmRunner
from .sacct_rows import ACTIVE_STATES, job_ids_of

if TYPE_CHECKING:
    from ..config import Config

RESOLVE_TIMEOUT_S = 5.0  # seff-gpu waits at most this long for sacct: a user is at the terminal
SQUEUE_TIMEOUT_S = 5.0  # seff-gpu asking whether a job still runs: a user is at the terminal
ALERTS_TIMEOUT_S = 30.0  # the service's idle-GPU pass
CONFIG_TIMEOUT_S = 10.0  # doctor reading the controller's configuration


def job_ids(slurm: SlurmRunner, spec: str, cluster: str | None = None,
            timeout_s: float = RESOLVE_TIMEOUT_S) -> dict[int, str]:
    """``{raw id: JobID}`` of the jobs ``spec`` names as accounting knows them, in one call: ``4`` of an
    array gives its tasks (``4_0``, ...), of a het job its components (``13+0``, ...), ``4_0`` that task.

    The hooks on the nodes see only the raw id (no SLURM_ARRAY_* nor het offset there), so right after a
    job ends its record has no array id or het offset until enrichment. A task still pending is no job
    here (:func:`sacct_rows.job_ids_of`)."""
    args = ["-X", "-n", "-P", "-o", "JobIDRaw,JobID", "-j", spec] + (["-M", cluster] if cluster else [])
    return job_ids_of(slurm.run("sacct", args, timeout_s))


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


def account_coordinators(config: Config, timeout_s: float) -> dict[str, list[str]]:
    """The site's account coordinators; none where Slurm keeps no accounting (``[sacct] accounting = false``:
    sacctmgr has no slurmdbd to ask)."""
    if not config.sacct.accounting:
        return {}
    return coordinators(SlurmRunner.from_config(config), timeout_s)


def coordinators(slurm: SlurmRunner, timeout_s: float) -> dict[str, list[str]]:
    """Every account's coordinators, from one bounded ``sacctmgr`` call; SlurmCommandError if it fails."""
    return parse_coordinators(slurm.run("sacctmgr", ["-P", "show", "user", "withcoord"], timeout_s))


class SlurmJob(NamedTuple):
    """A running job as squeue shows it; ``run``: its restart count, the run now in Slurm's hands (None where
    squeue did not say), so that a run that ended (requeued after a node failure) is not taken for the next."""

    state: str
    partition: str | None
    qos: str | None
    interactive: bool | None
    run: int | None = None


SQUEUE_FIELDS = "JobID:40,BatchFlag:8,Partition:200,QOS:200,State:24,RestartCnt:12"


def parse_squeue(text: str) -> dict[int, SlurmJob]:
    """``{raw job id: SlurmJob}`` from squeue -O JobID,BatchFlag,Partition,QOS,State,RestartCnt (no field holds
    a space; a line without the count is read without it)."""
    jobs: dict[int, SlurmJob] = {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) not in (5, 6) or not is_digits(cells[0]):
            continue
        batch = {"1": False, "0": True}.get(cells[1])
        run = int(cells[5]) if len(cells) == 6 and is_digits(cells[5]) else None
        jobs[int(cells[0])] = SlurmJob(cells[4].upper(), cells[2], cells[3], batch, run)
    return jobs


def squeue_jobs(slurm: SlurmRunner, ids: list[int], timeout_s: float = ALERTS_TIMEOUT_S) -> dict[int, SlurmJob]:
    """Slurm's view of the running jobs ``ids`` (every user's: ``-a``), asked in pieces of ids that Linux
    passes to a program (SlurmRunner.run_list); SlurmCommandError if any piece fails."""
    if not ids:
        return {}
    out: dict[int, SlurmJob] = {}
    for text in slurm.run_list("squeue", ["-h", "-a", "-j"], ids, ["-O", SQUEUE_FIELDS], timeout_s):
        out.update(parse_squeue(text))
    return out


class ActiveJob(NamedTuple):
    """A job squeue shows pending or running, and whose it is (None where squeue did not say)."""

    state: str
    user: str | None
    account: str | None
    uid: int | None = None  # squeue gives names; the privacy rules match a name when there is no uid


def parse_active(text: str) -> ActiveJob | None:
    """The first pending or running job of ``squeue -h -o '%T|%u|%a'`` (an array prints a line per task)."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if cells[0].upper() in ACTIVE_STATES:
            user = cells[1] if len(cells) > 1 and cells[1] else None
            account = cells[2] if len(cells) > 2 and cells[2] else None
            return ActiveJob(cells[0].upper(), user, account)
    return None


def active_job(slurm: SlurmRunner, spec: str, timeout_s: float = SQUEUE_TIMEOUT_S) -> ActiveJob | None:
    """Job ``spec`` while squeue shows it pending or running, else None (ended, unknown to the controller, or
    no answer: seff-gpu then says what the database knows)."""
    try:
        return parse_active(slurm.run("squeue", ["-h", "-j", spec, "-o", "%T|%u|%a"], timeout_s))
    except SlurmCommandError:
        return None


def set_admin_comment(slurm: SlurmRunner, job_id: int, text: str, timeout_s: float = ALERTS_TIMEOUT_S) -> None:
    """Write ``text`` into the job's AdminComment (kept by accounting: ``sacct -o AdminComment``)."""
    slurm.run("scontrol", ["update", f"JobId={job_id}", f"AdminComment={text}"], timeout_s)


def cancel(slurm: SlurmRunner, job_id: int, timeout_s: float = ALERTS_TIMEOUT_S) -> None:
    """``scancel`` the job."""
    slurm.run("scancel", [str(job_id)], timeout_s)


HOOK_KEYS = ("Prolog", "Epilog", "PrologFlags", "ClusterName", "AccountingStorageType")


_SHARDS_USED = re.compile(r"(?:^|,)shard(?::[^:(,=\s]+)?:\d+\(([0-9/,-]+)\)", re.ASCII)
_CONFIGURED = re.compile(r"(?:^|,)(gpu|shard)(?::[^:(,=\s]+)?:(\d+)", re.ASCII)


def parse_shard_counts(text: str) -> dict[int, int]:
    """``{GPU index: shards it has}`` from ``scontrol show node -d``. 24.11 and later list, in ``GresUsed``,
    each GPU's shards in use and its count, in index order (``shard:simh100:3(3/4,0/4,0/4,0/4)``; 26.05
    writes ``-/4`` for a GPU given whole). 22.05 lists only the indexes in use (``shard:simh100:1(IDX:0)``):
    there the configured ``Gres=gpu:T:4,shard:T:16`` gives each GPU an equal part, as Slurm spreads a shard
    count over the GPUs of its File= (an uneven spread is not told: {}). Empty when the node has no shards."""
    fields = dict(tok.partition("=")[::2] for tok in text.split() if "=" in tok)
    m = _SHARDS_USED.search(fields.get("GresUsed", ""))
    if m:
        pairs = [p.split("/") for p in m.group(1).split(",")]
        return {i: int(p[1]) for i, p in enumerate(pairs) if len(p) == 2 and is_digits(p[1])}
    configured: dict[str, int] = {}
    for kind, n in _CONFIGURED.findall(fields.get("Gres", "")):
        configured[kind] = configured.get(kind, 0) + int(n)
    gpus, shards = configured.get("gpu", 0), configured.get("shard", 0)
    if gpus and shards and shards % gpus == 0:
        return dict.fromkeys(range(gpus), shards // gpus)
    return {}


def shard_counts(slurm: SlurmRunner, node: str, timeout_s: float = CONFIG_TIMEOUT_S) -> dict[int, int]:
    """How many shards each GPU of ``node`` has (``scontrol show node -d``): what a job's shards are a share of."""
    return parse_shard_counts(slurm.run("scontrol", ["show", "node", "-d", node], timeout_s))


def shard_counter(slurm: SlurmRunner) -> Callable[[str], dict[int, int]]:
    """:func:`shard_counts` of a node, asked once per node for the life of the returned function (one enrich
    pass); a node Slurm cannot answer for gives {} (its jobs' shares stay unknown)."""
    known: dict[str, dict[int, int]] = {}

    def counts(node: str) -> dict[int, int]:
        if node not in known:
            try:
                known[node] = shard_counts(slurm, node)
            except SlurmCommandError:
                known[node] = {}
        return known[node]

    return counts


def private_data(slurm: SlurmRunner, timeout_s: float = CONFIG_TIMEOUT_S) -> frozenset[str]:
    """What the controller's ``PrivateData`` hides from ordinary users (``jobs``, ``usage``, ...), from one
    bounded ``scontrol show config``; SlurmCommandError if it fails or prints no such line."""
    return parse_private_data(slurm.run("scontrol", ["show", "config"], timeout_s))


def parse_private_data(text: str) -> frozenset[str]:
    """The ``PrivateData`` line of ``scontrol show config`` (``PrivateData             = accounts,jobs``, or
    ``= none``) as lower-case words; SlurmCommandError when the text has no such line (not scontrol's listing
    of a configuration: then nobody can say what Slurm hides)."""
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "PrivateData":
            words = {w.strip().lower() for w in value.split(",") if w.strip()}
            return frozenset(words - {"none", "(null)"})
    raise SlurmCommandError("scontrol show config printed no PrivateData line")


def show_config(slurm: SlurmRunner, timeout_s: float = CONFIG_TIMEOUT_S) -> dict[str, str]:
    """The controller's Prolog, Epilog, PrologFlags and ClusterName (``scontrol show config``)."""
    return hook_keys(slurm.run("scontrol", ["show", "config"], timeout_s).splitlines())


def hook_keys(lines: Iterable[str]) -> dict[str, str]:
    """:data:`HOOK_KEYS` from ``key = value`` lines (scontrol show config, or slurm.conf without comments).
    Slurm 26.05's scontrol lists every script of a key, ``Prolog[0] = ...``, ``Prolog[1] = ...``: those come
    back as one value, comma-separated, as slurm.conf writes them."""
    out: dict[str, str] = {}
    for line in lines:
        k, sep, v = line.partition("=")
        key = re.sub(r"\[\d+\]$", "", k.strip())
        if sep and key in HOOK_KEYS:
            out[key] = f"{out[key]},{v.strip()}" if key in out and k.strip() != key else v.strip()
    return out
