"""Files written where a person names them: ``seff-gpu --html FILE``, ``gpueff hook install DIR``, the demo's
folder. Such a file is never written over an existing one unless the person asked (``--force``), and never
through a symbolic link.

A plain ``open(path, "w")`` did both: ``ln -s target.txt link.html; seff-gpu --html link.html 7003``
rewrote target.txt, and run by root that writes anywhere a link points. Here the data goes to a new file
of a random name in the target's directory (``O_CREAT | O_EXCL | O_NOFOLLOW``: made by this call, never an
existing file or a link's target), then takes the target's name in one step:

- without ``force``, by ``link()``, which fails if the name exists in any form (a file, a directory, a
  symbolic link, even a dangling one), so nothing is replaced even if something appears meanwhile;
- with ``force``, by ``rename()``, which replaces the directory entry itself: a symbolic link there is
  replaced by the new file, its target left untouched. A directory is never replaced.

Either way a reader sees the old file or the whole new one, never a part. A file system without hard links
(``link()`` refused) gets the new file by ``O_EXCL | O_NOFOLLOW`` on the name itself: still no clobbering
and no link followed, only not atomic.

Stdlib only (``seff-gpu`` writes its pages with this on its client path, which must start fast).
"""

from __future__ import annotations

import errno
import os
import stat

from .errors import GpueffError

EXIT_EXISTS = 2  # the commands' "bad usage" status: the command line named a file that is there already


class OutputExists(GpueffError):
    """The named output is there already (a file, a link, a directory) and ``--force`` was not given."""

    exit_code = EXIT_EXISTS


class OutputError(GpueffError):
    """The output could not be written (no permission, no space, a missing directory...)."""

    exit_code = 1


def refuse_existing(path: str, force: bool) -> None:
    """:class:`OutputExists` if ``path`` would not be written: it exists and ``force`` is off, or it is a
    directory. For checking every name of a set before writing any of them."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise OutputExists(f"{path} is a directory: not replaced; name a file")
    if not force:
        what = "a symbolic link, not followed" if stat.S_ISLNK(st.st_mode) else "a file"
        raise OutputExists(f"{path} exists ({what}): not overwritten; --force replaces it")


def write(path: str, data: bytes, *, force: bool = False, mode: int = 0o666, exact_mode: bool = False) -> None:
    """Write ``data`` as the new file ``path``, as the module docstring says. ``mode``: the new file's
    permissions, less the umask unless ``exact_mode``. :class:`OutputExists` when the name is taken (and
    ``force`` is off, or it is a directory), :class:`OutputError` for any other failure, each one line."""
    refuse_existing(path, force)
    directory = os.path.dirname(path) or "."
    tmp = os.path.join(directory, f".{os.path.basename(path)[:64]}.{os.getpid()}-{os.urandom(6).hex()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(tmp, flags, mode)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        try:
            if exact_mode:
                os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if force:
                _replace(tmp, path)
            else:
                _link(tmp, path, data, flags, mode, exact_mode)
        except OSError as exc:
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        try:  # noqa: SIM105 - contextlib is one more import on seff-gpu's path
            os.unlink(tmp)
        except OSError:
            pass


def _replace(tmp: str, path: str) -> None:
    try:
        os.replace(tmp, path)
    except IsADirectoryError:  # appeared since the check
        raise OutputExists(f"{path} is a directory: not replaced; name a file") from None


def _link(tmp: str, path: str, data: bytes, flags: int, mode: int, exact_mode: bool) -> None:
    try:
        os.link(tmp, path)
        return
    except FileExistsError:
        refuse_existing(path, False)  # says what is there
        raise OutputExists(f"{path} exists: not overwritten; --force replaces it") from None
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            raise
    try:  # no hard links here: create the name itself, exclusively
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise OutputExists(f"{path} exists: not overwritten; --force replaces it") from None
    with os.fdopen(fd, "wb") as fh:
        if exact_mode:
            os.fchmod(fh.fileno(), mode)
        fh.write(data)
