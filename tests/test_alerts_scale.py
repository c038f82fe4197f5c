"""The idle-GPU pass at a large site's size: 40,000 running jobs through a ``squeue`` that is a real program.

The stand-in is an executable file (Python, run by the kernel through its ``#!`` line) beside the configured
``sacct``, found and started by the product's one Slurm runner exactly as the real squeue would be: it gets
the real argv, so a list of ids too long for one argument fails in ``exec`` with E2BIG before it runs, as it
would for Slurm's own squeue. It answers ``-h -a -j IDS -O FIELDS`` with one line per id it was asked about
(every job RUNNING, batch) and logs each call's argument sizes. What it does not cover: squeue's own speed on
a controller with 40,000 jobs (the pass's time is not asserted here; bench/site_scale.py measures it).
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from sqlalchemy import insert

from slurm_gpueff.config import Config
from slurm_gpueff.models import Job
from slurm_gpueff.service.alerts import run_alerts
from slurm_gpueff.slurm.runner import LIST_ARG_BYTES
from slurm_gpueff.storage.db import make_engine

T = datetime(2026, 11, 20, 12, 0, 0)
RUNNING = 40_000
FIRST = 10_000_000  # 8-digit ids, as a site a few years old has

SQUEUE = """#!{python}
import json, sys
args = sys.argv[1:]
ids = args[args.index("-j") + 1].split(",")
with open({log!r}, "a") as fh:
    fh.write(json.dumps({{"argc": len(sys.argv), "longest": max(map(len, args)), "ids": len(ids)}}) + "\\n")
sys.stdout.write("".join(f"{{i}} 1 gpu normal RUNNING 0\\n" for i in ids))
"""


@pytest.mark.process
def test_the_pass_judges_40000_running_jobs_through_a_real_squeue(tmp_path):
    log = tmp_path / "squeue.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(SQUEUE.format(python=sys.executable, log=str(log)))
    (bin_dir / "sacct").write_text("#!/bin/sh\nexit 1\n")
    for name in ("squeue", "sacct"):
        (bin_dir / name).chmod(0o755)
    ids = [FIRST + i for i in range(RUNNING)]

    # The stand-in is held to Linux's limit like any program: all ids in one -j argument cannot be started.
    with pytest.raises(OSError) as refused:
        subprocess.run([str(bin_dir / "squeue"), "-h", "-a", "-j", ",".join(map(str, ids))], check=False)
    assert refused.value.errno == errno.E2BIG

    engine = make_engine(str(tmp_path / "g.db"))
    try:
        with engine.begin() as c:  # the running jobs' live rows, as ingest stores them
            c.execute(insert(Job), [{"cluster": "testc", "job_id": i, "user": f"u{i % 500}", "account": "a",
                                     "record_source": "live", "state": "RUNNING", "gpu_count": 1,
                                     "start_time": T - timedelta(hours=2), "end_time": T} for i in ids])
        cfg = Config({"site": {"cluster": "testc"}, "alerts": {"enabled": True},
                      "sacct": {"command": str(bin_dir / "sacct")}})
        r = run_alerts(engine, cfg, now=T, dry_run=True)
    finally:
        engine.dispose()
    assert r.errors == [] and r.judged == RUNNING, (r.errors, r.judged)
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert sum(c["ids"] for c in calls) == RUNNING and len(calls) >= 2
    assert max(c["longest"] for c in calls) <= LIST_ARG_BYTES
