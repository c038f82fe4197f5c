"""A record's spool file is removed only once its commit is durable (power cut, kernel crash).

SQLite runs in WAL mode with ``synchronous=NORMAL``: a commit survives the ingest process dying (see
test_ingest_crash.py) but not the machine losing power until the WAL is fsync'd, and the file system may
persist the spool file's removal first. These tests run real ingests into real SQLite files and watch the
real system calls: every removal must follow an fsync of the WAL that began after the record's commit,
and a failing fsync must keep the files (their records are re-ingested next run, never duplicated).
A power cut itself cannot be staged here; the order of the calls is what makes it safe.
"""

from __future__ import annotations

import errno
import itertools
import os
import random
import threading

import pytest
from dbrows import rows

from slurm_gpueff import spool, synthetic
from slurm_gpueff.storage import ingest
from slurm_gpueff.storage.db import make_engine


def fill(d: str, n: int, first: int = 1) -> None:
    rng = random.Random(first)
    for i in range(n):
        spool.write_record(d, synthetic.record(first + i, rng=rng, timeline_points=2))


def test_files_are_removed_only_after_an_fsync_of_the_wal_that_followed_their_commit(tmp_path, monkeypatch):
    d, db = str(tmp_path / "spool"), str(tmp_path / "g.db")
    fill(d, 230)
    engine = make_engine(db)
    clock = itertools.count()
    lock = threading.Lock()
    commits: dict[str, int] = {}  # file -> when its batch's commit returned
    syncs: list[tuple[int, int]] = []  # (began, ended) of fsyncs of the WAL
    removed: dict[str, int] = {}
    real_write, real_fsync, real_unlink = ingest._write_batch, os.fsync, os.unlink
    wal = db + "-wal"

    def write_batch(engine, recs, turn=None):  # noqa: ANN001, ANN202
        real_write(engine, recs, turn)
        t = next(clock)
        for r in recs:
            commits[spool.record_name(r["job_id"], r["node"])] = t

    def fsync(fd: int) -> None:
        began = next(clock)
        real_fsync(fd)
        if os.readlink(f"/proc/self/fd/{fd}") == wal:
            with lock:
                syncs.append((began, next(clock)))

    def unlink(path: str) -> None:
        real_unlink(path)
        removed[os.path.basename(path)] = next(clock)

    monkeypatch.setattr(ingest, "_write_batch", write_batch)
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "unlink", unlink)
    res = ingest.ingest_spool(engine, d, batch=50)
    monkeypatch.undo()
    assert (res.ingested, res.failed) == (230, 0)
    assert sorted(removed) == sorted(commits) and len(removed) == 230
    assert syncs, "the WAL was never fsync'd"
    late = [f for f, t in removed.items() if not any(commits[f] < b and e < t for b, e in syncs)]
    assert late == [], f"{len(late)} file(s) removed before a durable commit, e.g. {late[:3]}"
    assert len(syncs) < 230 / 50 * 8, "one fsync per batch at most, shared by its unlink threads"


@pytest.mark.parametrize("workers", [1, 3])
def test_a_failing_fsync_keeps_the_files_and_the_next_run_adds_nothing_twice(tmp_path, monkeypatch, workers):
    d, db = str(tmp_path / "spool"), str(tmp_path / "g.db")
    fill(d, 120)
    monkeypatch.setattr(ingest, "PARALLEL_MIN", 10)  # real worker processes on a test-sized spool
    engine = make_engine(db)
    real_fsync = os.fsync

    def failing(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("-wal"):
            raise OSError(errno.EIO, "Input/output error")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing)
    first = ingest.ingest_spool(engine, d, workers=workers, batch=40)
    monkeypatch.setattr(os, "fsync", real_fsync)
    assert first.ingested == 120
    assert len(list(spool.pending(d))) == 120, "files of commits not known durable must stay"
    stored = rows(engine)
    assert len(stored["job"]) == 120
    again = ingest.ingest_spool(engine, d, workers=workers, batch=40)
    assert (again.ingested, again.failed) == (120, 0)
    assert list(spool.pending(d)) == []
    assert rows(engine) == stored
