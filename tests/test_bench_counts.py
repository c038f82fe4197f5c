"""The site bench's counts can fail (bench/sitecount.py): on real ingest into SQLite and PostgreSQL, a planted
loss and two planted duplicates (a job's second row under another run, a GPU's second row under another index)
are each counted; a clean database counts none."""

from __future__ import annotations

import os
import random
import sys

import pytest
import synthetic
from pgutil import pg_url  # noqa: F401  (fixture)
from sqlalchemy import text

from slurm_gpueff import spool
from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import sitecount  # noqa: E402

SENT = list(range(500, 520))


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_a_planted_loss_and_duplicates_are_counted(tmp_path, request, backend):
    url = str(tmp_path / "g.db") if backend == "sqlite" else request.getfixturevalue("pg_url")
    if backend == "postgres":
        migrate.upgrade(make_engine(url, create=False))  # gpueff db upgrade
    engine = make_engine(url)
    rng = random.Random(3)
    try:
        for j in SENT[:-1]:  # the last job's record never arrives: lost
            spool.write_record(str(tmp_path / "spool"), synthetic.record(j, rng=rng, gpus=2))
        assert ingest_spool(engine, str(tmp_path / "spool")).ingested == len(SENT) - 1
        assert sitecount.counts(engine, "synth", SENT[:-1]) == (19, 19, 0, 0, 0)  # clean: nothing counted
        with engine.begin() as c:
            # job 500 stored a second time under another run, with its GPU rows; job 501's first GPU again
            pk = c.execute(text("SELECT id FROM job WHERE job_id = 500")).scalar_one()
            cols = [k for k in c.execute(text("SELECT * FROM job WHERE id = :p"), {"p": pk}).mappings().one()
                    if k != "id"]
            names = ", ".join(f'"{k}"' for k in cols)
            values = ", ".join("7" if k == "run" else f'"{k}"' for k in cols)
            c.execute(text(f"INSERT INTO job ({names}) SELECT {values} FROM job WHERE id = :p"), {"p": pk})
            pk1 = c.execute(text("SELECT id FROM job WHERE job_id = 501")).scalar_one()
            c.execute(text("INSERT INTO job_gpu (job_pk, node, gpu_index, uuid, source, samples) SELECT job_pk, "
                           "node, 99, uuid, source, samples FROM job_gpu WHERE job_pk = :p AND gpu_index = 0"),
                      {"p": pk1})
        got = sitecount.counts(engine, "synth", SENT)
    finally:
        engine.dispose()
    assert got == sitecount.Counts(sent=20, stored=19, lost=1, duplicated_jobs=1, duplicated_gpus=1)
    assert got.line() == "finals stored 19 of 20: lost 1, duplicated 1 jobs and 1 GPUs"
