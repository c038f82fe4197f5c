"""``seff-gpu -u USER``: one line per job from the stored summaries, totals, JSON; real DB, real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import synthetic
from pgutil import pg_url  # noqa: F401  (fixture)
from sites import ingest_records, site_config

from slurm_gpueff.config import Config
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.storage.db import make_engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.process  # its tests start real processes (CLI commands, hooks, services)


@pytest.fixture
def site(tmp_path):
    cfg_path = site_config(tmp_path, tmp_path / "g.db", cluster=None, extra="[privacy]\nenabled = false\n")
    engine = make_engine(str(tmp_path / "g.db"))
    ingest_records(engine, tmp_path / "spool",  # 2024-01-01 .. 2024-01-02, various users
                   (synthetic.record(i + 1, gpus=1 + i % 3, timeline_points=2, end=1704067200 + i * 3600)
                    for i in range(40)))
    summarize_pending(engine, Config().analysis)
    return str(cfg_path), engine


def seff(cfg: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", cfg, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60, env={**os.environ, "TZ": "UTC"})


def test_json_lists_the_users_jobs_with_totals(site):
    cfg, engine = site
    from sqlalchemy import text

    with engine.connect() as c:
        user, n, hours = c.execute(text("SELECT user, count(*), sum(gpu_hours) FROM job GROUP BY user "
                                        "ORDER BY count(*) DESC LIMIT 1")).one()
    out = seff(cfg, "-u", user, "-S", "2023-12-31", "-E", "2024-01-03", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["schema"] == "slurm-gpueff/seff-gpu-jobs" and len(doc["jobs"]) == n
    assert {j["user"] for j in doc["jobs"]} == {user}
    assert doc["totals"]["gpu_hours"] == pytest.approx(hours)
    for j in doc["jobs"]:
        if j["waste_gpu_hours"] is not None:
            assert j["waste_gpu_hours"] == pytest.approx(j["idle_gpu_hours"] + j["underfilled_gpu_hours"])
    # A window that excludes everything.
    out = seff(cfg, "-u", user, "-S", "2020-01-01", "-E", "2020-02-01", "--json")
    assert json.loads(out.stdout)["jobs"] == []


def test_json_figures_are_rounded_as_the_one_job_document(site):
    """``-u --json`` printed the stored floats as they were (0.20659999999999998): its figures, the totals'
    too, keep the decimals of a card's --json (fmt.number: 6, seconds 3, joules 1)."""
    cfg, engine = site
    from sqlalchemy import text

    with engine.connect() as c:
        user, raw = c.execute(text("SELECT user, sum(sm_active_gpu_hours) FROM job GROUP BY user "
                                   "ORDER BY count(*) DESC LIMIT 1")).one()
    assert raw != round(raw, 6)  # the sum as stored has more decimals than JSON shows: the test can fail
    out = seff(cfg, "-u", user, "-S", "2023-12-31", "-E", "2024-01-03", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    digits = {"elapsed_s": 3, "total_cpu_s": 3, "energy_j": 1}
    seen = 0
    for figures in (*doc["jobs"], doc["totals"]):
        for key, value in figures.items():
            if isinstance(value, float):
                seen += 1
                assert value == round(value, digits.get(key, 6)), (key, value)
    assert seen > len(doc["jobs"]) * 5
    one = json.loads(seff(cfg, "--json", str(doc["jobs"][0]["raw_job_id"])).stdout)["jobs"][0]
    assert doc["jobs"][0]["gpu_hours"] == one["figures"]["gpu_hours"]["value"]  # the same figure, the same digits
    assert doc["jobs"][0]["sm_active"] == one["figures"]["sm_active"]["value"]


def test_table_has_a_line_per_job_and_totals(site):
    cfg, _engine = site
    out = seff(cfg, "-A", synthetic.ACCOUNTS[0], "-S", "2023-12-31", "-E", "2024-01-03")
    out2 = seff(cfg, "-A", synthetic.ACCOUNTS[0], "-S", "2023-12-31", "-E", "2024-01-03", "--json")
    n = len(json.loads(out2.stdout)["jobs"])
    lines = out.stdout.splitlines()
    assert out.returncode == 0, out.stderr
    if n:
        assert lines[1].startswith("JobID") and "Verdict" in lines[1] and "WasteGPU-h" in lines[1]
        assert len(lines) == 1 + 1 + 1 + n + 1 + 1  # title, head, rule, jobs, rule, totals
        assert lines[-1].startswith(f"Total ({n} job{'' if n == 1 else 's'})")
    else:
        assert lines[-1] == "(none)"


def test_bad_time_and_missing_arguments_are_usage_errors(site):
    cfg, _engine = site
    assert seff(cfg, "-u", "x", "-S", "yesterday").returncode == 2
    assert seff(cfg).returncode == 2


@pytest.mark.parametrize("tz", ["Asia/Tokyo", "America/New_York", "UTC"])
def test_times_beyond_the_calendar_once_in_utc_are_one_line(site, tz):
    """Year 1 or 9999 in local time may fall outside what a datetime holds once turned into UTC, and -E in
    year 1's first week leaves no room for the default -S a week before: each was a traceback."""
    cfg, _engine = site
    for args, says in ((["-S", "0001-01-01"], "out of range once turned into UTC"),
                       (["-S", "9999-12-31T23:00", "-E", "9999-12-31T23:59:59"], "out of range once turned into UTC"),
                       (["-E", "0001-01-03T00:00+00:00"], "too early for the default -S")):
        p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", cfg, "-u", "x", *args],
                           cwd=ROOT, capture_output=True, text=True, timeout=60, env={**os.environ, "TZ": tz})
        if tz == "UTC" and says.startswith("out of range") and p.returncode == 0:  # in UTC they may fit
            continue
        assert p.returncode == 2 and p.stdout == "", (tz, args, p.stdout, p.stderr)
        assert p.stderr.startswith("seff-gpu: ") and says in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_a_long_table_shows_the_newest_lines_and_totals_over_all(tmp_path):
    """A year of an account is half a million jobs: the table prints the newest --limit lines (and says so) while
    its totals line and the JSON totals stay over every job, the same figures as the whole table's."""
    cfg = str(site_config(tmp_path, tmp_path / "g.db", cluster=None, extra="[privacy]\nenabled = false\n"))
    engine = make_engine(str(tmp_path / "g.db"))
    ingest_records(engine, tmp_path / "spool", ({**synthetic.record(i + 1, gpus=1 + i % 3, timeline_points=2,
                                                                    end=1704067200 + i * 3600), "account": "big"}
                                                for i in range(12)))
    summarize_pending(engine, Config().analysis)
    window = ("-S", "2023-12-31", "-E", "2024-01-03")
    whole = json.loads(seff(cfg, "-A", "big", *window, "--json", "--limit", "0").stdout)
    n = len(whole["jobs"])
    assert n > 3 and whole["totals"]["rows"] == n
    cut = json.loads(seff(cfg, "-A", "big", *window, "--json", "--limit", "3").stdout)
    assert [j["raw_job_id"] for j in cut["jobs"]] == [j["raw_job_id"] for j in whole["jobs"]][-3:]
    for key, value in whole["totals"].items():
        assert cut["totals"][key] == pytest.approx(value), key
    text = seff(cfg, "-A", "big", *window, "--limit", "3")
    lines = text.stdout.splitlines()
    assert text.returncode == 0, text.stderr
    assert f"The newest 3 of {n} lines" in lines[1] and len(lines) == 2 + 2 + 3 + 2
    assert lines[-1].startswith(f"Total ({whole['totals']['jobs']} jobs)")
    assert seff(cfg, "-u", "x", "--limit", "-1").returncode == 2
    engine.dispose()


@pytest.mark.postgres
def test_postgres_totals_are_the_rows_totals(pg_url, tmp_path):  # noqa: F811
    """The database's totals (what a cut table shows) equal the ones computed from every row, NULLs included."""
    from datetime import datetime, timedelta

    from sqlalchemy import literal, select
    from sqlmodel import Session

    from slurm_gpueff.models import Job
    from slurm_gpueff.render.jobs_table import totals
    from slurm_gpueff.storage import migrate
    from slurm_gpueff.storage.summaries import list_jobs, table_totals

    engine = make_engine(pg_url, create=False)
    migrate.upgrade(engine)
    ingest_records(engine, tmp_path / "spool", (synthetic.record(i + 1, gpus=1 + i % 3, timeline_points=2,
                                                                 end=1704067200 + i * 3600) for i in range(60)))
    summarize_pending(engine, Config().analysis)
    # Requeued jobs: more runs of some jobs (a provisional -1 among them), some inside the window, some
    # after it or before it, so that a job counts once among the lines whichever of its runs the window holds.
    job = Job.metadata.tables["job"]
    copied = [c.name for c in job.c if c.name not in ("id", "run", "end_time")]
    with engine.begin() as conn:
        for job_id, run, hours in ((3, 1, 2), (3, 2, 400), (5, -1, 1), (7, 1, 500), (9, 1, 3), (9, 2, 4),
                                     (11, -1, -72)):
            conn.execute(job.insert().from_select(
                [*copied, "run", "end_time"],
                select(*(job.c[n] for n in copied), literal(run), job.c.end_time + timedelta(hours=hours))
                .where(job.c.job_id == job_id, job.c.run == 0)))
    with Session(engine) as s:
        scope = {"start": datetime(2023, 12, 31), "end": datetime(2024, 1, 9)}
        rows = list_jobs(s, **scope)
        got = table_totals(s, **scope)
    assert rows and got["rows"] == len(rows) and len(rows) == 60 + 4  # 3's run 2 and 7's run 1 end after it
    assert got["jobs"] == len({(r.cluster, r.job_id) for r in rows}) == 60
    for key, value in totals(rows).items():
        assert got[key] == pytest.approx(value), key
    engine.dispose()
