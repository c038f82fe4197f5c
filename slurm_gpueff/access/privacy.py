"""Who may see which jobs: like ``sacct`` with ``PrivateData=jobs``, plus account leads.

A :class:`Viewer` is the person asking: ``seff-gpu``'s own user on its direct path, the uid MUNGE vouches
for on the service's API. The same pure rules decide on both paths:

- a job's card is shown to its owner (by uid, else by user name), to those who lead its account
  (``[leads]``, and Slurm's account coordinators when ``[privacy] coordinators``), and to those
  who see everything: root, the account the service runs as, ``[privacy] admins``, everyone when
  ``[privacy] enabled = false``;
- a table (``-u``/``-A``) lists one's own jobs; another user's only for those who see everything, or
  within an account the viewer leads (``-u USER -A ACCOUNT``); an account's jobs (``-A ACCOUNT``) only
  for its leads and those who see everything.

Enforcing this in ``seff-gpu`` alone would be a courtesy: the database itself is private to the service
account, and users read it through the service, which applies these rules where the data is.

A job the viewer may not see is refused as another user's (exit 6), except where Slurm's own ``PrivateData``
includes ``jobs``: there sacct and squeue show a user nothing of other users' jobs, and "not yours" would
tell which job ids exist, so such a job gets exactly the answer of a job that does not exist
(:func:`hides_others_jobs`).
"""

from __future__ import annotations

import logging
import os
import pwd
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol, TypeVar

from ..config import Config
from ..errors import GpueffError

EXIT_DENIED = 6
PRIVATE_DATA_TTL_S = 300.0  # Slurm's PrivateData is asked at most this often by a process that answers many

log = logging.getLogger("gpueff.privacy")


class Denied(GpueffError):
    """The viewer may not see what they asked for (seff-gpu's exit status 6)."""

    exit_code = EXIT_DENIED


class Owned(Protocol):
    """A job as far as ownership goes (a database row or an accounting record)."""

    @property
    def uid(self) -> int | None: ...

    @property
    def user(self) -> str | None: ...

    @property
    def account(self) -> str | None: ...


_Job = TypeVar("_Job", bound=Owned)
_Gpus = TypeVar("_Gpus")


class Viewer(NamedTuple):
    """Who is asking: uid, user name (None if the uid has none), whether they see every job, the accounts
    whose jobs they see as a lead or coordinator, and whether they administer the service (:func:`admin`)."""

    uid: int
    name: str | None
    all: bool = False
    accounts: frozenset[str] = frozenset()
    admin: bool = False


def admin(config: Config, uid: int, name: str | None, service_uid: int | None) -> bool:
    """Whether ``uid`` administers the service: root, the account the service runs as, ``[privacy] admins``.
    Only they are told where the job database is and what its driver said when it fails (its URL, host and
    port): everybody else learns that it is unavailable, whatever ``[privacy] enabled`` says."""
    return uid == 0 or uid == service_uid or (name is not None and name in config.privacy.admins)


def current_user() -> tuple[int, str | None]:
    """(uid, user name) of the person running the command."""
    return os.getuid(), user_name(os.getuid())


def user_name(uid: int) -> str | None:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return None


def viewer(config: Config, uid: int, name: str | None, service_uid: int | None = None,
           coordinators: Callable[[], Mapping[str, Sequence[str]]] | None = None) -> Viewer:
    """The Viewer for ``uid``/``name``, by ``[privacy]`` and ``[leads]``. ``service_uid``: the account the
    service runs as (it reads the whole database anyway). ``coordinators``: Slurm's {account: [coordinator,
    ...]}, asked only when it matters (privacy on, a user who does not see everything, ``[privacy]
    coordinators``)."""
    privacy = config.privacy
    if admin(config, uid, name, service_uid):
        return Viewer(uid, name, all=True, admin=True)
    if not privacy.enabled:
        return Viewer(uid, name, all=True)
    if name is None:
        return Viewer(uid, name)
    leads: dict[str, Sequence[str]] = dict(config.leads)
    if privacy.coordinators and coordinators is not None:
        for account, users in coordinators().items():
            leads[account] = [*leads.get(account, ()), *users]
    return Viewer(uid, name, accounts=frozenset(a for a, users in leads.items() if name in users))


def owns(job: Owned, uid: int, name: str | None) -> bool:
    if job.uid is not None:
        return job.uid == uid
    return name is not None and job.user == name


def may_see(v: Viewer, job: Owned) -> bool:
    """Whether ``v`` may see this job's card."""
    return v.all or owns(job, v.uid, v.name) or bool(v.accounts and job.account in v.accounts)


def shown(found: Sequence[tuple[_Job, _Gpus]], v: Viewer) -> tuple[list[tuple[_Job, _Gpus]], int]:
    """(the (job, gpus) pairs ``v`` may see, how many were hidden)."""
    seen = [(j, g) for j, g in found if may_see(v, j)]
    return seen, len(found) - len(seen)


def table_scope(v: Viewer, user: str | None, account: str | None) -> tuple[str | None, str | None]:
    """The (user, account) a ``-u``/``-A`` table may list for ``v``; :class:`Denied` when it asks for more.

    No ``-u`` nor ``-A``: one's own jobs. ``-A`` alone: all of the account's jobs, for its leads only."""
    if v.all:
        return user, account
    leads = account is not None and account in v.accounts
    if user is None:
        if account is None or leads:
            return (None if leads else v.name), account
        raise Denied(f"only the leads and coordinators of account {account} may list its jobs; your own jobs in "
                     f"it: -u {v.name or v.uid} -A {account} ([privacy] and [leads] in the config)")
    if user == v.name or leads:
        return user, account
    raise Denied(f"you may only list your own jobs (user {v.name or f'uid {v.uid}'}), or those of an account you "
                 "lead with -A ACCOUNT; [privacy] and [leads] in the config")


def denied_message(spec: str, v: Viewer) -> str:
    who = v.name or f"uid {v.uid}"
    return (f"job {spec} belongs to another user: seff-gpu shows {who} only their own jobs and those of accounts "
            "they lead (like sacct with PrivateData=jobs). Ask the job's owner, or an administrator to add you to "
            "[privacy] admins or to [leads].")


_private: dict[str | None, tuple[float, bool]] = {}  # scontrol's path -> (when asked, whether jobs are hidden)
_asking = threading.Lock()


def hides_others_jobs(config: Config) -> bool:
    """Whether a job the viewer may not see is answered exactly as one that does not exist (seff-gpu's exit 3,
    its line and nothing more), as Slurm answers where ``PrivateData`` includes ``jobs``; otherwise it is
    refused as another user's (exit 6).

    Read from ``scontrol show config`` through the Slurm runner (one bounded call) and kept
    :data:`PRIVATE_DATA_TTL_S` in this process: the service asks once every few minutes, seff-gpu's direct path
    once when it needs to. Where scontrol cannot answer (not installed, no controller, a time-out) jobs are
    hidden: "no such job" tells nothing, "not yours" would tell that the job exists, so that is the safe way
    to be wrong. The service's log says so, once per :data:`PRIVATE_DATA_TTL_S`; the commands print nothing
    more (their answer must be the bytes the service gives)."""
    from ..slurm.commands import RESOLVE_TIMEOUT_S, private_data
    from ..slurm.runner import SlurmCommandError, SlurmRunner

    runner = SlurmRunner.from_config(config)
    where = runner.path("scontrol")
    with _asking:
        at, hidden = _private.get(where, (-PRIVATE_DATA_TTL_S, True))
        if time.monotonic() - at < PRIVATE_DATA_TTL_S:
            return hidden
        try:
            hidden = "jobs" in private_data(runner, min(RESOLVE_TIMEOUT_S, config.sacct.timeout_s))
        except SlurmCommandError as exc:
            hidden = True
            if log.hasHandlers():  # the service's log; a command's stderr is its answer alone
                log.warning("Slurm's PrivateData is unknown (%s): another user's job is answered as one that "
                            "does not exist (exit 3), the safe side; asked again in %.0f s", exc, PRIVATE_DATA_TTL_S)
        _private[where] = (time.monotonic(), hidden)
        return hidden
