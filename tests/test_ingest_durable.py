"""A record's spool file is removed only once its commit is durable (power cut, kernel crash).

A commit that only reached the operating system's cache survives the ingest process dying (see
test_ingest_crash.py) but not the machine losing power, and the file system may persist the spool
file's removal first. SQLite runs in WAL mode with ``synchronous=FULL``: a commit returns once the WAL
is synced. These tests run real ingests into real SQLite files under ``strace`` and watch the real
system calls: no spool file may be removed while the WAL holds writes not yet synced, and a failing
sync must keep the files (their records are ingested by the next run, never twice). A power cut itself
cannot be staged here; the order of the calls is what makes it safe.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
import synthetic
from dbrows import rows
from hooksite import ROOT

from slurm_gpueff import spool
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool

CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.ingest import ingest_spool

    res = ingest_spool(make_engine(sys.argv[2]), sys.argv[3], batch=int(sys.argv[4]))
    print(json.dumps([res.ingested, res.quarantined, res.failed, res.errors]))
""")


def _strace_works() -> bool:
    if shutil.which("strace") is None:
        return False
    return subprocess.run(["strace", "-o", os.devnull, "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(not _strace_works(), reason="needs strace, allowed to trace (apt-get install strace)")


def fill(d: str, n: int, first: int = 1) -> None:
    rng = random.Random(first)
    for i in range(n):
        spool.write_record(d, synthetic.record(first + i, rng=rng, timeline_points=2))


def traced_ingest(db: str, d: str, batch: int, *strace_args: str) -> list[Any]:
    """Ingest in a child process under strace; returns [ingested, quarantined, failed, errors]."""
    make_engine(db).dispose()  # the schema first, outside the trace
    p = subprocess.run(["strace", "-f", "-qq", *strace_args, sys.executable, "-c", CHILD, ROOT, db, d, str(batch)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def calls(trace: str) -> Iterator[tuple[str, str, str, str | None]]:
    """(pid, call, arguments, result) at each system call's start ('start', no result yet) and end."""
    started: dict[str, tuple[str, str]] = {}
    with open(trace) as fh:
        for line in fh:
            pid, rest = line.rstrip("\n").split(None, 1)
            if rest.startswith("<... "):
                call, args = started.pop(pid)
                yield pid, call, args, rest.rsplit("=", 1)[1].split()[0]
            elif rest.endswith("<unfinished ...>"):
                m = re.match(r"(\w+)\((.*?)\s*<unfinished", rest)
                assert m, line
                started[pid] = (m[1], m[2])
                yield pid, m[1], m[2], "start"
            elif m := re.match(r"(\w+)\((.*)\)\s+=\s+(-?\d+)", rest):
                yield pid, m[1], m[2], "start"
                yield pid, m[1], m[2], m[3]


def test_files_are_removed_only_while_every_wal_write_is_synced(tmp_path):
    d, db, trace = str(tmp_path / "spool"), str(tmp_path / "g.db"), str(tmp_path / "trace")
    fill(d, 230)
    ingested, _q, failed, errors = traced_ingest(
        db, d, 50, "-o", trace, "-e", "trace=openat,close,pwrite64,write,fsync,fdatasync,unlink,unlinkat")
    assert (ingested, failed) == (230, 0), errors
    assert list(spool.pending(d)) == []
    # A file's commit is the first commit after the file was read: its WAL writes are the first ones after
    # the read, and it is durable at the first WAL sync after those writes. The file may go only then.
    # (The files of one commit are removed while the next batch already writes: those writes are not theirs.)
    fds: dict[str, str] = {}
    read: set[str] = set()  # read, its commit's WAL writes not seen yet
    written: set[str] = set()  # its commit's WAL writes seen, not synced yet
    syncs, removed, late = 0, [], []
    for _pid, call, args, result in calls(trace):
        first = args.split(",", 1)[0]
        if call == "openat" and result not in ("start", None) and int(result) >= 0:
            fds[result] = path = args.split('"')[1]
            if "/incoming/job-" in path:
                read.add(path)
        elif call == "close" and result == "start":
            fds.pop(first, None)
        elif call in ("pwrite64", "write") and result == "start" and fds.get(first) == db + "-wal":
            written |= read
            read.clear()
        elif call in ("fsync", "fdatasync") and result == "0" and fds.get(first) == db + "-wal":
            written.clear()
            syncs += 1
        elif call in ("unlink", "unlinkat") and result == "start" and "/incoming/job-" in args:
            path = args.split('"')[1]
            removed.append(path)
            if path in read or path in written:
                late.append(path)
    assert len(removed) == 230
    assert syncs >= 230 // 50, "one WAL sync per commit at least"
    assert late == [], f"{len(late)} file(s) removed before their commit was on disk, e.g. {late[:3]}"


def test_a_failing_sync_keeps_the_files_and_the_next_run_adds_nothing_twice(tmp_path):
    d, db = str(tmp_path / "spool"), str(tmp_path / "g.db")
    fill(d, 120)
    ref_spool = str(tmp_path / "ref-spool")
    fill(ref_spool, 120)
    ref = make_engine(str(tmp_path / "ref.db"))
    assert ingest_spool(ref, ref_spool).ingested == 120
    # Every sync of the ingest fails, as on a disk going bad: no commit can be known durable.
    ingested, _q, failed, errors = traced_ingest(db, d, 40, "-o", os.devnull, "-e", "trace=fsync,fdatasync",
                                                 "-e", "inject=fsync,fdatasync:error=EIO")
    assert (ingested, failed) == (0, 120)
    assert "database unavailable" in errors[0] and "I/O error" in errors[0]
    assert len(list(spool.pending(d))) == 120, "files of commits not known durable must stay"
    engine = make_engine(db)
    again = ingest_spool(engine, d, batch=40)
    assert (again.ingested, again.failed) == (120, 0)
    assert list(spool.pending(d)) == []
    assert rows(engine) == rows(ref)
    assert ingest_spool(engine, d).ingested == 0 and rows(engine) == rows(ref)
