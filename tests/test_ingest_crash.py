"""kill -9 in the middle of an ingest: every record ends up in the database exactly once, none is lost.

A real ingest process (real SQLite file, real spool) is SIGKILLed twice while it drains thousands of
records; a final run must leave an empty spool and exactly one job per record, with all its GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap

import pytest
from hooksite import ROOT, make_record

from slurm_gpueff import spool

pytestmark = pytest.mark.process  # ingest in a child process, killed mid-run

N = 3000
GPUS = 2

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.ingest import ingest_spool

    def progress(done, total):
        print(done, total, flush=True)

    res = ingest_spool(make_engine(sys.argv[2]), sys.argv[3], progress=progress)
    print("result", res.ingested, res.quarantined, res.failed, flush=True)
""")


def _write_spool(spool_dir: str) -> None:
    spool.ensure_dirs(spool_dir)
    inc = os.path.join(spool_dir, "incoming")
    for j in range(1, N + 1):  # plain writes: the spool layout is just files, fsync is not under test
        node = f"gpu{j % 3}"
        with open(os.path.join(inc, spool.record_name(j, node)), "w") as fh:
            json.dump(make_record(j, node=node, gpus=GPUS), fh)


def _spawn(db: str, spool_dir: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, ROOT, db, spool_dir], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _kill_after(proc: subprocess.Popen, at_least: int) -> int:
    """SIGKILL the ingest once it reported ``at_least`` records done; return what it had reported."""
    done = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        parts = line.split()
        if parts and parts[0].isdigit():
            done = int(parts[0])
            if done >= at_least:
                os.kill(proc.pid, signal.SIGKILL)
                break
    proc.wait(timeout=60)
    return done


def test_sigkill_mid_ingest_loses_nothing_and_duplicates_nothing(tmp_path):
    db, spool_dir = str(tmp_path / "gpueff.db"), str(tmp_path / "spool")
    _write_spool(spool_dir)

    for round_ in range(2):
        done = _kill_after(_spawn(db, spool_dir), at_least=400)
        assert done >= 400  # it reported a committed batch, then died
        left = len(list(spool.pending(spool_dir)))
        con = sqlite3.connect(db)
        try:
            stored = con.execute("SELECT count(*) FROM job").fetchone()[0]
        finally:
            con.close()
        # Mid-run: batches committed, others not. Committed files may still be there (they are removed in
        # threads after the commit, while the next batch is read), which the next run re-ingests harmlessly.
        assert 400 <= stored < N and left > 0, f"round {round_}: the kill did not land mid-run ({stored} stored, " \
                                               f"{left} files left)"

    proc = _spawn(db, spool_dir)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    ingested, quarantined, failed = map(int, out.strip().splitlines()[-1].split()[1:])
    assert (quarantined, failed) == (0, 0)
    assert list(spool.pending(spool_dir)) == [], "spool must be empty"
    assert os.listdir(os.path.join(spool_dir, "quarantine")) == []

    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert con.execute("SELECT count(*), count(DISTINCT job_id), min(job_id), max(job_id) FROM job"
                           ).fetchone() == (N, N, 1, N)
        assert con.execute("SELECT count(*) FROM job_gpu").fetchone()[0] == N * GPUS
        assert con.execute("SELECT count(*) FROM job_gpu_timeline").fetchone()[0] == N * GPUS
        bad = con.execute("SELECT job_id FROM job WHERE gpu_count != ? OR nodelist != 'gpu' || (job_id % 3)",
                          (GPUS,)).fetchall()
        assert bad == []
        dup = con.execute("SELECT job_pk, node, gpu_index, count(*) FROM job_gpu GROUP BY 1, 2, 3 "
                          "HAVING count(*) > 1").fetchall()
        assert dup == []
    finally:
        con.close()
