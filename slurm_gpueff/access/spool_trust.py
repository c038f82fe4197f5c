"""The spool's trust: which of its files are records the nodes wrote, and reading one so that it stays so.

The spool trusts only what the nodes wrote (:class:`SpoolTrust`): a regular file, named like a record,
owned by root or the spool's owner, writable by its owner only, and not larger than the limit. It is opened
without following links and without waiting (a FIFO), and checked and read through that one descriptor,
so it cannot be swapped in between. Ingest (storage/ingest.py) and the node's forwarder (node/push.py) read
the spool only through here; what it refuses they quarantine with the reason. Like access/peer.py it asks
the kernel (owner, mode, kind), never the file's own claims. No database code: the forwarder runs on hosts
that have none.
"""

from __future__ import annotations

import errno
import os
import pwd
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from .. import spool
from ..errors import ConfigError, RecordError

if TYPE_CHECKING:
    from ..config import Config

MAX_FILE_MB = 64.0
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket", stat.S_IFCHR:
          "a character device", stat.S_IFBLK: "a block device", stat.S_IFLNK: "a symbolic link"}


@dataclass(frozen=True)
class SpoolTrust:
    """Whose spool files ingest and the forwarder take (root's always) and how large; built by :func:`spool_trust`."""

    owners: frozenset[int]
    max_bytes: int

    def problem(self, st: os.stat_result) -> str | None:
        """Why an entry with this ``lstat``/``fstat`` is not a record the nodes wrote; None if it may be."""
        kind = stat.S_IFMT(st.st_mode)
        if kind != stat.S_IFREG:
            return f"{_KINDS.get(kind, 'a special file')}, not a regular file: the spool takes records only"
        if st.st_uid not in self.owners:
            return (f"owned by {_user(st.st_uid)}; the spool takes records written by "
                    f"{' or '.join(_user(u) for u in sorted(self.owners))} only")
        if st.st_mode & 0o022:
            return (f"group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o}): anyone might have written "
                    "it; records are written 0600")
        if st.st_size > self.max_bytes:
            return f"{st.st_size} bytes, over the limit of {self.max_bytes} ([spool] max_file_mb)"
        return None


def spool_trust(spool_dir: str, owner: str = "", max_file_mb: float = MAX_FILE_MB) -> SpoolTrust:
    """The trust of ``[spool]``: root and ``owner`` (a user name or uid; "" = the owner of ``incoming/``)."""
    owners = {0}
    if owner:
        if owner.isascii() and owner.isdigit():
            owners.add(int(owner))
        else:
            try:
                owners.add(pwd.getpwnam(owner).pw_uid)
            except KeyError:
                raise ConfigError(f"spool.owner = {owner!r}: no such user") from None
    else:
        for d in (spool.incoming_dir(spool_dir), spool_dir):
            try:
                owners.add(os.stat(d).st_uid)
                break
            except OSError:
                continue
        else:
            owners.add(os.getuid())
    return SpoolTrust(frozenset(owners), int(max_file_mb * 1024 * 1024))


def configured_trust(config: Config) -> SpoolTrust:
    return spool_trust(config.paths.spool_dir, config.spool.owner, config.spool.max_file_mb)


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def read_json(path: str, trust: SpoolTrust | None = None) -> Any:
    """One spool file's JSON, not yet validated (the forwarder leaves that to the service, which trusts no
    node); RecordError if it is not trusted or not JSON."""
    if trust is not None:
        name = os.path.basename(path)
        if not spool.RECORD_NAME.fullmatch(name):
            raise RecordError("not named like a record (job-<id>-...json): the spool takes records only")
        problem = trust.problem(os.lstat(path))  # before any open: a device or FIFO is never opened
        if problem:
            raise RecordError(problem)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):  # swapped for a link or a socket since the lstat
            raise RecordError(f"not a regular file ({exc.strerror}): the spool takes records only") from None
        raise
    with open(fd, "rb") as fh:
        if trust is not None:
            problem = trust.problem(os.fstat(fd))  # the file read is the file checked
            if problem:
                raise RecordError(problem)
        data = fh.read()
    if not data.strip():
        raise RecordError("empty file")
    try:
        rec = orjson.loads(data)
    except ValueError as exc:  # JSONDecodeError (orjson's too) and UnicodeDecodeError
        raise RecordError(f"not valid JSON: {exc}") from None
    return rec
