"""dcgm-exporter's HPC job mapping (``dcgm.exporter_mapping``): ``DIR/<DCGM gpu id>`` lists the jobs on that GPU.

The Prolog adds the job's id to each of its GPUs' files, the Epilog takes it out. Each change is
read-modify-write under an exclusive ``flock`` (two hooks may run at once) and lands with an atomic
rename, so the exporter never reads a half file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os

from .. import spool

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

LOCK_NAME = ".gpueff.lock"


def _read_ids(path: str) -> list[str]:
    try:
        with open(path) as fh:
            return [ln.strip() for ln in fh if ln.strip()]
    except FileNotFoundError:
        return []


@contextlib.contextmanager
def _locked(directory: str) -> Iterator[None]:
    """Hold an exclusive flock on the directory's lock file (closing the file releases it)."""
    fd = os.open(os.path.join(directory, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def add_job(directory: str, gpu_ids: Iterable[int], job_id: str) -> None:
    os.makedirs(directory, mode=0o755, exist_ok=True)
    with _locked(directory):
        for gid in sorted(set(int(g) for g in gpu_ids)):
            path = os.path.join(directory, str(gid))
            ids = _read_ids(path)
            if job_id not in ids:
                ids.append(job_id)
            spool.atomic_write(path, ("\n".join(ids) + "\n").encode(), mode=0o644)


def remove_job(directory: str, gpu_ids: Iterable[int], job_id: str) -> None:
    """Take ``job_id`` out of the file of each GPU id, deleting emptied files."""
    if not os.path.isdir(directory):
        return
    with _locked(directory):
        for gid in sorted(set(int(g) for g in gpu_ids)):
            path = os.path.join(directory, str(gid))
            ids = _read_ids(path)
            if job_id not in ids:
                continue
            rest = [i for i in ids if i != job_id]
            if rest:
                spool.atomic_write(path, ("\n".join(rest) + "\n").encode(), mode=0o644)
            else:
                os.unlink(path)
