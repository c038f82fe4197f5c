"""Activity over time on the job card: the terminal card's sparkline per GPU, ``--json``'s ``series`` and the
HTML page's chart, all from the coarse timelines (job_gpu_timeline), through the real ``seff-gpu`` on a
SQLite database (the standard-library read path) built with the real models. Figures are simulated.
"""

from __future__ import annotations

import json
import re

import pytest
from sites import NO_GPM, job_site, sim_record, store
from sqlmodel import Session, select
from test_seff_cli import run

from slurm_gpueff.fmt import NO_DATA, SPARKS
from slurm_gpueff.models import JobGpu
from slurm_gpueff.seff import sqlite_read
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.queries import gpu_timelines

LINE = re.compile(rf"^(SM|Kernel) activity over (\S+): ([{SPARKS}{NO_DATA}]{{40}})  \((.+)\)$")


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    def fill(s: Session) -> None:
        store(s, sim_record(8101, "bf16-healthy", 2, 2.25), timeline=True)
        store(s, sim_record(8102, "bf16-healthy", 1, 1.0))  # no timeline row: retention deleted it
        store(s, sim_record(8103, "one-of-n-gpus", 12, 1.0), timeline=True)
        rec = sim_record(8104, "bf16-healthy", 1, 1.0, backend="nvml")  # no GPM: kernel activity only
        for m in ("sm_active", "tensor_active"):
            rec["gpus"][0][m] = None
            rec["gpus"][0]["missing"][m] = NO_GPM
        rec["gpus"][0]["timeline"] = [[p[0], p[1], None, None] for p in rec["gpus"][0]["timeline"]]
        store(s, rec, timeline=True)

    return job_site(tmp_path_factory.mktemp("activity"), fill)


def activity(out: str) -> list[re.Match[str]]:
    return [m for line in out.splitlines() if (m := LINE.match(line))]


def test_card_has_a_sparkline_per_gpu(site):
    p = run(site, "8101")
    assert p.returncode == 0, p.stderr
    lines = activity(p.stdout)
    assert [(m[1], m[2], m[4]) for m in lines] == [("SM", "02:15:00", "GPU 0"), ("SM", "02:15:00", "GPU 1")]
    cells = lines[0][3]
    assert NO_DATA not in cells  # the simulated timeline covers the whole job: no hole
    assert cells[0] < cells[-1]  # ramp-up: the first point is at half the steady activity
    assert max(len(line) for line in p.stdout.splitlines()) <= 80


def test_no_timeline_no_line(site):
    p = run(site, "8102")
    assert p.returncode == 0, p.stderr
    assert "activity over" not in p.stdout


def test_many_gpus_show_the_first_eight(site):
    out = run(site, "8103").stdout
    lines = activity(out)
    assert [m[4] for m in lines] == [f"GPU {i}" for i in range(8)]
    assert "\u2026 4 more GPUs" in out
    assert lines[1][3] == SPARKS[0] * 40  # a GPU never used reads as the lowest bar: measured, and idle


def test_kernel_activity_without_gpm(site):
    lines = activity(run(site, "8104").stdout)
    assert [m[1] for m in lines] == ["Kernel"]


def test_json_series(site):
    job = json.loads(run(site, "8101", "--json").stdout)["jobs"][0]
    for gpu in job["gpus"]:
        s = gpu["series"]
        assert set(s) == {"t_s", "kernel_active", "sm_active", "tensor_active"}
        assert len(s["t_s"]) == len(s["sm_active"]) == len(s["kernel_active"]) == len(s["tensor_active"]) > 1
        assert s["t_s"] == sorted(s["t_s"]) and all(0 <= v <= 1 for v in s["sm_active"])
    assert json.loads(run(site, "8102", "--json").stdout)["jobs"][0]["gpus"][0]["series"] is None
    nvml = json.loads(run(site, "8104", "--json").stdout)["jobs"][0]["gpus"][0]["series"]
    assert set(nvml["sm_active"]) == {None} and None not in nvml["kernel_active"]


def test_html_page_keeps_its_chart(site, tmp_path):
    p = run(site, "8101", "--html", str(tmp_path / "card.html"))
    assert p.returncode == 0, p.stderr
    assert 'src="data:image/png;base64,' in (tmp_path / "card.html").read_text()


def test_sqlite_read_gives_the_orm_timelines(site):
    db = site[0] / "gpueff.db"
    engine = make_engine(str(db))
    with Session(engine) as s:
        gpus = list(s.exec(select(JobGpu)).all())
        orm = gpu_timelines(s, gpus)
        ids = [g.id for g in gpus if g.id is not None]
    engine.dispose()
    assert orm and sqlite_read.timelines(str(db), ids) == orm
    assert sqlite_read.timelines(str(db), []) == {}
