"""Who may see which job's card: like ``sacct`` with ``PrivateData=jobs``.

A user other than root sees only their own jobs (matched by uid, else by user name) unless
``[privacy] admins`` names them or ``[privacy] enabled = false``. Only the commands enforce this; against
direct reads, restrict the database itself (file mode, PostgreSQL roles).
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence
from typing import Protocol, TypeVar

from .config import PrivacyConfig


class Owned(Protocol):
    """A job as far as ownership goes (a database row or an accounting record)."""

    @property
    def uid(self) -> int | None: ...

    @property
    def user(self) -> str | None: ...


_Job = TypeVar("_Job", bound=Owned)
_Gpus = TypeVar("_Gpus")


def current_user() -> tuple[int, str | None]:
    """(uid, user name) of the person running the command."""
    uid = os.getuid()
    try:
        return uid, pwd.getpwuid(uid).pw_name
    except KeyError:
        return uid, None


def sees_everything(privacy: PrivacyConfig, uid: int, name: str | None) -> bool:
    return uid == 0 or not privacy.enabled or (name is not None and name in privacy.admins)


def owns(job: Owned, uid: int, name: str | None) -> bool:
    if job.uid is not None:
        return job.uid == uid
    return name is not None and job.user == name


def visible(found: Sequence[tuple[_Job, _Gpus]], privacy: PrivacyConfig, uid: int | None = None,
            name: str | None = None) -> tuple[list[tuple[_Job, _Gpus]], int]:
    """(the (job, gpus) pairs this user may see, how many were hidden)."""
    if uid is None:
        uid, name = current_user()
    if sees_everything(privacy, uid, name):
        return list(found), 0
    shown = [(j, g) for j, g in found if owns(j, uid, name)]
    return shown, len(found) - len(shown)


def denied_message(spec: str, name: str | None) -> str:
    who = name or f"uid {os.getuid()}"
    return (f"job {spec} belongs to another user: seff-gpu shows {who} only their own jobs (like sacct with "
            "PrivateData=jobs). Ask the job's owner, or an administrator to add you to [privacy] admins.")
