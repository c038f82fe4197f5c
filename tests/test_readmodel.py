"""The read model (slurm_gpueff/readmodel.py): one shape of a job for the analysis, the renderers, the reports
and seff-gpu, made in three places only, equal wherever it is made.

- Its fields are the tables' columns, name for name and in order (ingest's merge and the live card take
  their columns from it, so a column added to the tables and not here fails).
- A live record made into rows by the node's live view (seff/livecard.py, no database) gives the rows ingest
  stores for it, read back by the SQLite fast path and the SQLAlchemy path (the store's own ids aside).
- Only the three makers construct rows; the analysis and the renderers import no models and ask no
  ``getattr`` default; readmodel.py itself loads no SQLAlchemy.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import subprocess
import sys

import pytest
from hooksite import make_record
from sqlmodel import Session

from slurm_gpueff.analysis import assess, job_figures
from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.readmodel import GPU_COLUMNS, JOB_COLUMNS, GpuRow, JobRow, Shared, Window, gpu_row, job_row
from slurm_gpueff.render import dumps, render_card
from slurm_gpueff.seff import sqlite_read
from slurm_gpueff.seff.livecard import rows_of
from slurm_gpueff.slurm.jobid import parse
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.queries import find_jobs, job_gpus
from slurm_gpueff.storage.writer import ingest_record

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "slurm_gpueff")


def test_the_fields_are_the_tables_columns_in_order():
    assert tuple(c.name for c in Job.__table__.columns) == JOB_COLUMNS  # type: ignore[attr-defined]
    assert tuple(c.name for c in JobGpu.__table__.columns) == GPU_COLUMNS  # type: ignore[attr-defined]


def test_rows_are_frozen_and_absent_columns_take_the_models_defaults():
    job = job_row({"cluster": "c", "job_id": 5, "not_a_column": 1})  # a database not yet upgraded: no run, sluid
    assert (job.run, job.sluid, job.enriched, job.record_source, job.backend) == (0, None, False, "hook", "none")
    assert job == JobRow(cluster="c", job_id=5) and not job.live
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.state = "COMPLETED"  # type: ignore[misc]
    gpu = gpu_row({"node": "n1", "gpu_index": 0, "missing": None, "window": None, "shared": None})
    assert gpu == GpuRow(node="n1", gpu_index=0) and gpu.missing == {}


def test_window_and_shared_are_typed_from_their_json():
    w = Window.of({"start": 1, "end": 2.5, "start_exact": True, "gaps": [[1, 2, "agent down"]], "break": "reboot"})
    assert w == Window(start=1, end=2.5, start_exact=True, gaps=((1, 2, "agent down"),), broken="reboot")
    assert Window.of(None) is None and Shared.of("x") is None
    sh = Shared.of({"share": 0.5, "with": ["7", "8"]})
    assert sh == Shared(others=("7", "8"), with_count=2, share=0.5)
    assert sh.as_json() == {"share": 0.5, "with": ["7", "8"]}  # --json: the object as recorded, in its order
    assert list(sh.as_json()) == ["share", "with"]
    assert list(Shared().as_json()) == ["with", "with_count", "method", "share", "shared_s", "unmeasured_s",
                                        "unattributed", "gpu_kernel_active"]  # made here: the agent's order


def test_the_live_view_gives_the_rows_ingest_stores(tmp_path):
    """The node's live card (no database) and the service (ingest, then either reader) see the same job."""
    rec = make_record(41, gpus=2, live=True, exit_code=None, signal=None)
    live_job, live_gpus, timelines = rows_of(rec)
    engine = make_engine(str(tmp_path / "g.db"))
    try:
        with Session(engine) as s:
            ingest_record(s, rec)
            s.commit()
        ((fast_job, fast_gpus),) = sqlite_read.lookup(str(tmp_path / "g.db"), parse("41"))
        with Session(engine) as s:
            ((orm_job, orm_gpus),) = [(j, job_gpus(s, j)) for j in find_jobs(s, parse("41"))]
    finally:
        engine.dispose()
    assert (fast_job, fast_gpus) == (orm_job, orm_gpus)
    stored = dataclasses.replace(fast_job, id=None, ingested_at=None)
    assert dataclasses.replace(live_job, ingested_at=None) == stored and live_job.live
    assert [dataclasses.replace(g, id=None, job_pk=None) for g in fast_gpus] == live_gpus
    assert set(timelines) == {("node01", 0), ("node01", 1)}
    fig_live, fig_stored = job_figures(live_job, live_gpus), job_figures(fast_job, fast_gpus)
    assert render_card(live_job, fig_live, assess(fig_live)) == render_card(fast_job, fig_stored, assess(fig_stored))
    assert dumps([(live_job, fig_live, assess(fig_live))]) == dumps([(fast_job, fig_stored, assess(fig_stored))])


# the SQLAlchemy path (queries, and the summaries on it), the SQLite fast path, the node's live view
MAKERS = {"storage/queries.py", "storage/summaries.py", "seff/sqlite_read.py", "seff/livecard.py"}


NOT_ROWS = {os.path.join("reports", "smtp.py")}  # an SMTP exception's optional code, no row


def _calls(tree: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call)]


def test_only_the_three_paths_make_rows_and_readers_ask_no_defaults():
    made, defaults = [], []
    for dirpath, _dirs, files in os.walk(PKG):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, PKG)
            with open(path) as fh:
                tree = ast.parse(fh.read(), path)
            for call in _calls(tree):
                name = call.func.id if isinstance(call.func, ast.Name) else getattr(call.func, "attr", "")
                if name in ("job_row", "gpu_row", "JobRow", "GpuRow") and rel != "readmodel.py" and rel not in MAKERS:
                    made.append(f"{rel}:{call.lineno} {name}")
                if (name == "getattr" and len(call.args) == 3 and rel not in NOT_ROWS
                        and rel.split(os.sep)[0] in ("analysis", "render", "reports", "seff")):
                    defaults.append(f"{rel}:{call.lineno}")
    assert not made, f"read-model rows made outside the three paths: {made}"
    assert not defaults, f"getattr with a default on the read model's readers: {defaults}"


@pytest.mark.process
def test_the_live_card_loads_no_database_library():
    """What the node agent runs for ``seff-gpu`` on the job's node: a live record made into rows, analysed and
    rendered, in a process that then holds no SQLAlchemy, SQLModel, pydantic or models."""
    code = ("import sys; sys.path.insert(0, 'tests'); from hooksite import make_record\n"
            "from slurm_gpueff.seff.livecard import rows_of\n"
            "from slurm_gpueff.analysis import assess, job_figures\n"
            "from slurm_gpueff.render import render_card\n"
            "job, gpus, tl = rows_of(make_record(41, live=True, exit_code=None, signal=None))\n"
            "fig = job_figures(job, gpus); card = render_card(job, fig, assess(fig), (), tl)\n"
            "heavy = ('sqlalchemy', 'sqlmodel', 'pydantic', 'slurm_gpueff.models')\n"
            "print('Job ID: 41' in card, sorted(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True []", out.stdout + out.stderr
