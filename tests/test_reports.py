"""Reports without a mail server: the monthly SQL aggregates, config checks, archive files, seff-gpu --html,
and that a (non-editable) wheel carries the templates. GPU figures are simulated; the rest is real."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from email import message_from_bytes, policy

import pytest
from pgutil import pg_url  # noqa: F401 - a fixture
from record_rows import rows_of_models
from reports_data import EVIL_NAME, config, make_db
from sqlmodel import Session, select

from slurm_gpueff.config import Config
from slurm_gpueff.errors import ConfigError
from slurm_gpueff.models import Job
from slurm_gpueff.reports import monthly, runner
from slurm_gpueff.reports.card import clean
from slurm_gpueff.reports.prices import Prices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAY = 24.0


def test_monthly_aggregates_equal_a_brute_force_sum(tmp_path):
    now = 1.7e9 + 40 * 86400  # 2023-12-24: jobs this month, last month, and one ending on the boundary
    jobs = [dict(job_id=300 + n, profile=p, user=u, account=a, hours=h, ended_ago_h=ago, now=now, gpus=g)
            for n, (p, u, a, h, ago, g) in enumerate([
                ("idle", "u1", "acc", 2.0, 1, 1), ("one-sm-spin", "u1", "acc", 3.0, 5, 1),
                ("bf16-healthy", "u2", "acc", 4.0, 30, 2), ("starved", "u3", "other", 1.0, 2, 1),
                ("memory-bound", "u2", "acc", 2.5, 30 * DAY, 1)])]
    engine = make_db(tmp_path, jobs)
    cfg = config(tmp_path, price_per_gpu_hour={"Simulated H100 80GB": 3.0})
    month = "2023-12"
    start, end = monthly.month_bounds(month)
    prices = Prices(cfg.reports.price_per_gpu_hour, "EUR")
    with Session(engine) as s:
        rows = [j for j in s.exec(select(Job)).all() if j.account == "acc" and start <= j.end_time < end]
        t = monthly.totals(s, start, end, "acc", prices)
        users = monthly.by_group(s, "user", start, end, "acc", prices)
        summary = monthly.build_summary(s, cfg, month, "acc")
    assert len(rows) == 3 and t.jobs == 3
    assert t.hours["allocated"] == pytest.approx(sum(j.gpu_hours for j in rows))
    assert t.hours["idle"] == pytest.approx(sum(j.idle_gpu_hours for j in rows))
    assert t.hours["underfilled"] == pytest.approx(sum(j.underfilled_gpu_hours for j in rows))
    assert t.hours["active"] == pytest.approx(sum(j.sm_active_gpu_hours for j in rows))
    assert t.cost["allocated"] == pytest.approx(3.0 * t.hours["allocated"])
    assert set(users) == {"u1", "u2"} and users["u1"].jobs == 2
    assert "account acc" in summary.subject and "u3" not in summary.text  # other account
    assert "No GPU jobs ended in November 2023" not in summary.text  # the memory-bound job did
    assert "Against November 2023" in summary.text


def test_monthly_counts_gpus_under_their_own_verdict(tmp_path):
    """A lead read "GPU never used: 2 jobs, 19.50 GPU-h" where one of the jobs had used its fourth GPU fully.
    Verdicts are per GPU: the summary counts GPUs under each one's first verdict, that GPU under "No problem
    found"; the rows add up to the month's GPUs, GPU-hours and lost hours."""
    now = 1.7e9 + 40 * 86400
    jobs = [dict(job_id=700, profile="one-of-n-gpus", user="u1", account="acc", hours=4.0, gpus=4, now=now),
            dict(job_id=701, profile="idle", user="u2", account="acc", hours=3.5, gpus=1, now=now),
            dict(job_id=702, profile="bf16-healthy", user="u2", account="acc", hours=6.0, gpus=2, now=now)]
    engine = make_db(tmp_path, jobs)
    cfg = config(tmp_path, price_per_gpu_hour={"default": 2.0})
    with Session(engine) as s:
        summary = monthly.build_summary(s, cfg, "2023-12", None)
        t = monthly.totals(s, *monthly.month_bounds("2023-12"), None, Prices({"default": 2.0}, "EUR"))
    rows = {v["verdict"]: v for v in summary.context["verdicts"]}
    assert set(rows) == {"never_used", "healthy", ""}
    assert (rows["never_used"]["gpus"], rows["never_used"]["jobs"], rows["never_used"]["users"]) == (4, 2, 2)
    assert rows["never_used"]["hours"] == pytest.approx(3 * 4.0 + 3.5)  # not the worked GPU's 4 hours
    assert rows["never_used"]["wasted"] == pytest.approx(3 * 4.0 + 3.5)
    assert (rows[""]["gpus"], rows[""]["jobs"], rows[""]["hours"]) == (1, 1, pytest.approx(4.0))
    assert (rows["healthy"]["gpus"], rows["healthy"]["jobs"]) == (2, 1)
    assert sum(v["gpus"] for v in rows.values()) == 4 + 1 + 2
    assert sum(v["hours"] for v in rows.values()) == pytest.approx(t.hours["allocated"])
    assert sum(v["wasted"] for v in rows.values()) == pytest.approx(t.wasted)
    text = summary.text
    assert "GPUs by verdict:" in text and "Jobs by verdict" not in text
    assert "  GPU never used:                4 GPUs    2 jobs    15.50 GPU-h, 15.50 lost\n" in text, text
    assert "  No problem found:              1 GPU     1 job      4.00 GPU-h, " in text
    words = " ".join(text.split())
    assert "1. GPU never used: 15.50 GPU-hours (\u20ac31.00) lost on 4 GPUs in 2 jobs by 2 users." in words
    html = summary.html()
    assert ">GPUs by verdict<" in html and "on 4 GPUs in 2 jobs by 2 users" in html
    cells = re.findall(r">([^<>]+)</td>", html.split(">GPUs by verdict<", 1)[1])
    assert cells[cells.index("GPU never used"):][:3] == ["GPU never used", "4", "2"], cells  # verdict, GPUs, jobs
    assert cells[cells.index("No problem found"):][:3] == ["No problem found", "1", "1"], cells


@pytest.mark.postgres
def test_monthly_summary_is_the_same_on_postgresql(tmp_path, pg_url):  # noqa: F811
    """The report queries are plain SQL aggregates: PostgreSQL and SQLite give the same summary."""
    jobs = [dict(job_id=400 + n, profile=p, user=u, account=a, hours=h, gpus=g, now=1.7e9 + 40 * 86400)
            for n, (p, u, a, h, g) in enumerate([("idle", "u1", "acc", 2.0, 1), ("one-sm-spin", "u1", "acc", 0.6, 1),
                                                  ("one-of-n-gpus", "u2", "other", 3.0, 4)])]
    cfg = config(tmp_path, price_per_gpu_hour={"default": 2.5})
    texts = []
    for url in (None, pg_url):
        engine = make_db(tmp_path, jobs, url=url)
        with Session(engine) as s:
            summary = monthly.build_summary(s, cfg, "2023-12", None)
        engine.dispose()
        texts.append((summary.subject, summary.text))
    assert texts[0] == texts[1]
    assert "for 14.60 GPU-hours (\u20ac36.50)" in texts[1][1].replace("\n", " ")


def test_monthly_summary_says_how_many_of_its_jobs_were_simulated(tmp_path):
    """A summary over simulated jobs is labelled so in its Subject, text and HTML; over some simulated jobs it
    says how many; over measured ones it carries no label. The simulated collector gives every job here its
    figures, so "measured" ones are made by writing a real backend into the summary rows."""
    jobs = [dict(job_id=500 + n, profile="idle", user="u", account="a", hours=1.0) for n in range(3)]
    engine = make_db(tmp_path, jobs)
    cfg = config(tmp_path)

    def summary():  # type: ignore[no-untyped-def]
        with Session(engine) as s:
            month = s.exec(select(Job)).first().end_time.strftime("%Y-%m")  # type: ignore[union-attr]
            return monthly.build_summary(s, cfg, month, None)

    def set_backend(ids: set[int], backend: str) -> None:
        with Session(engine) as s:
            for job in s.exec(select(Job)).all():
                if job.job_id in ids:
                    job.backend = backend
                    s.add(job)
            s.commit()

    every = summary()
    assert every.subject.startswith("[c] SIMULATED DATA: GPU-hours ")
    with Session(engine) as s:  # and each job's card, as its body says already
        card = runner.render_job_card(s, rows_of_models(s.exec(select(Job)).first())[0], cfg)
    assert card.subject.startswith("[c] SIMULATED DATA: GPU job 50"), card.subject
    assert every.text.startswith("*** SIMULATED DATA \u2014 figures from simulated GPUs, not real ones ***\n")
    assert "SIMULATED DATA \u2014 figures from simulated GPUs" in every.html()
    set_backend({500, 501}, "nvml-gpm")
    some = summary()
    assert some.subject.startswith("[c] SIMULATED DATA: ")
    assert some.text.startswith("*** SIMULATED DATA \u2014 1 of these 3 jobs was measured on simulated GPUs")
    set_backend({502}, "nvml-gpm")
    none = summary()
    assert "SIMULATED" not in none.subject + none.text + none.html()


def test_unpriced_model_shows_no_invented_cost(tmp_path):
    engine = make_db(tmp_path, [dict(job_id=1, profile="idle", user="u", account="a", hours=2.0)])
    cfg = config(tmp_path, price_per_gpu_hour={"Some Other GPU": 1.0})
    with Session(engine) as s:
        job = s.exec(select(Job)).one()
        summary = monthly.build_summary(s, cfg, job.end_time.strftime("%Y-%m"), None)
        card = runner.render_job_card(s, rows_of_models(job)[0], cfg)
    assert "n/a" in summary.text and "\u20ac" not in summary.text
    assert "Cost of the" in card.text and "n/a" in card.text.split("Cost of the")[1]


@pytest.mark.parametrize("section, text, message", [
    ("mail", "security = 'tls'", "mail.security = 'tls'; expected one of none, starttls, ssl"),
    ("mail", "port = 70000", "mail.port = 70000 is not a TCP port"),
    ("reports", "address_pattern = 'gpu@example.org'", "must contain {user}"),
    ("reports", "leads = { physics = ['pi_smith'] }", "reports.leads moved to [leads] (account = [user names])"),
    ("reports", "price_per_gpu_hour = { default = 'cheap' }", "must be a number >= 0"),
])
def test_bad_report_config_is_a_clear_error(tmp_path, section, text, message):
    p = tmp_path / "c.toml"
    p.write_text(f"[{section}]\n{text}\n")
    from slurm_gpueff.config import load

    with pytest.raises(ConfigError) as err:
        load(str(p))
    assert message in str(err.value)


def test_addresses_and_header_safe_text():
    rep = Config({"reports": {"address_pattern": "{user}@uni.example", "addresses": {"bob": "b.b@lab.example"}}}
                 ).reports
    assert runner.user_address("alice", rep) == "alice@uni.example"
    assert runner.user_address("bob", rep) == "b.b@lab.example"
    assert runner.user_address("x\nBcc: y", rep) is None
    assert runner.user_address(None, rep) is None and runner.user_address("", rep) is None
    assert runner.valid_address("a@b.example, c@d.example") is None
    assert "\n" not in clean(EVIL_NAME) and "\r" not in clean(EVIL_NAME)


def test_dry_run_archive_is_complete_and_viewable(tmp_path):
    engine = make_db(tmp_path, [dict(job_id=7, profile="one-of-n-gpus", user="u", account="a", gpus=4, hours=2)],
                     names={7: EVIL_NAME})
    cfg = config(tmp_path)
    assert runner.send_cards(cfg, engine, dry_run=True).written == 1
    assert runner.send_cards(cfg, engine, dry_run=True).written == 0  # never twice, dry runs too
    (folder,) = [d for d, _, files in os.walk(tmp_path / "reports") if "message.eml" in files]
    assert sorted(os.listdir(folder)) == ["activity-chart.png", "card.html", "card.txt", "message.eml"]
    with open(os.path.join(folder, "card.html"), encoding="utf-8") as fh:
        html = fh.read()
    assert 'src="activity-chart.png"' in html and "cid:" not in html  # opens in a browser as it is
    with open(os.path.join(folder, "message.eml"), "rb") as fh:
        msg = message_from_bytes(fh.read(), policy=policy.default)
    assert msg["Bcc"] is None and msg["Auto-Submitted"] == "auto-generated"


@pytest.mark.process
def test_seff_gpu_html_writes_the_card(tmp_path):
    make_db(tmp_path, [dict(job_id=42, profile="starved", user="u", account="a", hours=2)])
    (tmp_path / "c.toml").write_text(f'[paths]\ndatabase = "{tmp_path / "jobs.db"}"\n')
    out = tmp_path / "card.html"
    proc = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "--config", str(tmp_path / "c.toml"),
                           "42", "--html", str(out)], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "Job ID: 42" in proc.stdout  # the terminal card is still printed
    html = out.read_text(encoding="utf-8")
    assert "Verdict: Starved" in html and 'src="data:image/png;base64,' in html


@pytest.mark.process
def test_wheel_carries_the_templates(tmp_path):
    """`pip install .` (not editable) must find the templates: they are in the wheel as package data."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q",
                           "-w", str(tmp_path), ROOT], capture_output=True, text=True, check=False, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = [f for f in os.listdir(tmp_path) if f.endswith(".whl")]
    names = set(zipfile.ZipFile(tmp_path / wheel).namelist())
    for t in ("card.html.j2", "card.txt.j2", "monthly.html.j2", "monthly.txt.j2", "_macros.html.j2", "_prose.j2",
              "advice.toml"):
        assert f"slurm_gpueff/reports/templates/{t}" in names, t


@pytest.mark.smtp
def test_no_summary_is_sent_for_a_month_without_jobs(tmp_path, smtp_server):
    """A new install's service catches up last month at its first start: with no jobs there is nothing to
    say, so nothing is mailed (and nothing claimed in the sent-log: a later backfill may still send it)."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.reports.runner import send_monthly
    from slurm_gpueff.storage.db import make_engine

    inbox, port = smtp_server
    engine = make_engine(str(tmp_path / "empty.db"))
    cfg = Config({"mail": {"host": "127.0.0.1", "port": port}, "leads": {"physics": ["pi"]},
                  "reports": {"dir": str(tmp_path / "reports"), "admins": ["admins@uni.example"],
                              "address_pattern": "{user}@uni.example"}})
    try:
        res = send_monthly(cfg, engine, month="2026-10")
    finally:
        engine.dispose()
    assert res.sent == 0 and inbox.messages == [], res
    assert "monthly 2026-10 *: no jobs ended in the month; nothing sent" in res.lines, res.lines


def test_a_month_already_written_is_not_built_again(tmp_path, monkeypatch):
    """The service runs the monthly task at every start (a missed 1st is caught up): at a site with 500
    accounts it built every summary again, 5 minutes of work, only to find each one in the sent-log. A second
    run builds none and says each is already written."""
    now = 1.7e9 + 40 * 86400  # 2023-12-24
    jobs = [dict(job_id=400 + n, profile="idle", user=u, account=a, hours=2.0, ended_ago_h=2, now=now)
            for n, (u, a) in enumerate([("u1", "acc"), ("u2", "other")])]
    engine = make_db(tmp_path, jobs)
    cfg = config(tmp_path, coordinators_as_leads=False)
    built: list[str | None] = []
    real = runner.build_summary

    def counted(session, config, month, account):  # noqa: ANN001, ANN202
        built.append(account)
        return real(session, config, month, account)

    monkeypatch.setattr(runner, "build_summary", counted)
    first = runner.send_monthly(cfg, engine, month="2023-12", dry_run=True)
    assert sorted(built, key=str) == [None, "acc", "other"], first.lines
    built.clear()
    again = runner.send_monthly(cfg, engine, month="2023-12", dry_run=True)
    assert built == [], built
    assert {"monthly 2023-12 acc: already written", "monthly 2023-12 other: already written",
            "monthly 2023-12 *: already written"} <= set(again.lines), again.lines
    engine.dispose()


def test_the_runs_account_writes_control_characters_as_escapes(tmp_path):
    """`gpueff report cards` prints a line per card; the user name comes from the job (and the terminal of the admin
    who runs it must not take an ESC from it): a user without a usable address is skipped, and the line names them
    with their control characters escaped."""
    hostile = "mal\x1b[2J\x07lory\u202e"
    engine = make_db(tmp_path, [dict(job_id=8, profile="one-of-n-gpus", user=hostile, account="a", gpus=4, hours=2)])
    cfg = Config({"reports": {"dir": str(tmp_path / "reports"), "card_min_gpu_hours": 0.0,
                              "address_pattern": "{user}@uni.example", "card_only_unhealthy": False}})
    result = runner.send_cards(cfg, engine, dry_run=True)
    assert result.skipped == 1, result.lines
    (line,) = result.lines
    assert line.startswith("skipped card ") and "mal\\u001b[2J\\u0007lory\\u202e" in line, line
    assert not any(ch in line for ch in "\x1b\x07\u202e"), line


def test_cards_wait_for_the_pushes_and_the_analysis(tmp_path, monkeypatch):
    """The service's card pass calls, before each card it renders, the API's make_way and then waits while
    a task analyses stored jobs (summarize_pending, from the ingest or enrich task), at most CARD_WAIT_S:
    after an outage the backlog's jobs all become due for a card at once, and their rendering took CPU
    from the stores and the analysis the backlog waits on. Here the ingest task's analysis runs for 2 s
    in another thread: the first card is written only after it ended, and make_way was asked once per card.
    A task that runs without analysing (enrich asking sacct) holds no card back."""
    import threading
    import time

    from slurm_gpueff.reports import charts
    from slurm_gpueff.service import summarize, tasks

    engine = make_db(tmp_path, [dict(job_id=n, profile="one-of-n-gpus", user=f"u{n}", account="a", gpus=2, hours=2)
                                for n in (7, 8)])
    cfg = config(tmp_path, cards=True)
    cfg = Config({**cfg.as_dict(), "mail": {**cfg.as_dict()["mail"], "dry_run": True}})
    ways: list[float] = []
    ctx = tasks.Context(cfg, engine, make_way=lambda: ways.append(time.monotonic()))
    started = threading.Event()
    analysis_end: list[float] = []

    charts.job_chart([[[0.0, 0.5, 0.5, 0.0], [60.0, 0.5, 0.5, 0.0]]], 1)  # matplotlib loaded: cards come fast

    def slow_analysis(*_args: object) -> int:
        started.set()
        time.sleep(2.0)
        analysis_end.append(time.time())
        return 0

    monkeypatch.setattr(summarize, "summarize_pending", slow_analysis)
    analysing = threading.Thread(target=ctx.analyse)
    analysing.start()
    assert started.wait(10)
    out = tasks.report_cards(ctx)
    analysing.join()
    assert "written (dry-run) 2" in out, out
    assert len(ways) == 2 and ctx.summarizing == 0  # once a card
    written = sorted(os.path.getmtime(os.path.join(d, "message.eml"))
                     for d, _, files in os.walk(tmp_path / "reports") if "message.eml" in files)
    assert len(written) == 2 and written[0] >= analysis_end[0] - 0.01

    # a running task that is not analysing: no wait
    ctx.runs["enrich"] = tasks.TaskRun(time.time(), time.monotonic())
    t0 = time.monotonic()
    tasks.after_analysis(ctx)
    assert time.monotonic() - t0 < 1.0


def test_charts_drawn_in_threads_equal_charts_drawn_alone():
    """Cards and monthly summaries are drawn by different tasks' threads of the service: eight threads
    drawing both kinds at once give byte for byte the PNGs drawn one at a time (matplotlib's object API and
    one style, applied per chart)."""
    from concurrent.futures import ThreadPoolExecutor

    from slurm_gpueff.reports import charts

    tl = [[[60.0 * t, (t % 7) / 7, (t % 5) / 6, (t % 3) / 9] for t in range(80)] for _ in range(3)]
    rows = [{"label": f"user{n}", "allocated": 10.0 - n, "active": 3.0, "underfilled": 2.0, "idle": 4.0 - n,
             "unmeasured": 1.0} for n in range(3)]
    alone = (charts.job_chart(tl, 3), charts.split_chart(rows, "GPU-hours by user"))
    assert alone[0] and alone[1] and alone[0].startswith(b"\x89PNG")
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda n: charts.job_chart(tl, 3) if n % 2 else charts.split_chart(
            rows, "GPU-hours by user"), range(32)))
    assert all(png == alone[n % 2 == 0 and 1 or 0] for n, png in enumerate(together))


_APART = """
import os, signal, sys
from slurm_gpueff.reports import charts
tl = [[[60.0 * t, (t % 7) / 7, (t % 5) / 6, (t % 3) / 9] for t in range(80)] for _ in range(3)]
charts.draw_apart()
first = charts.job_chart(tl, 3)
apart = "matplotlib" not in sys.modules
(child,) = charts._CHILD.pool._processes  # noqa: SLF001 - the test kills it
os.kill(child, signal.SIGKILL)
second = charts.job_chart(tl, 3)  # the child is gone: drawn here
third = charts.job_chart(tl, 3)  # in a new child
charts.draw_here()
sys.stdout.buffer.write(b"%d %d %d\\n" % (apart, first == second, second == third))
"""


@pytest.mark.process
def test_the_service_draws_its_charts_in_a_child_process(tmp_path):
    """`gpueff serve` has its charts drawn by one child process (charts.draw_apart), off the interpreter
    lock its pushes and answers share: the parent never imports matplotlib, the PNG is the one drawn in
    process, and a child killed mid-service costs one chart drawn in the parent (with a warning in the
    log), the next in a new child."""
    out = subprocess.run([sys.executable, "-c", _APART], capture_output=True, timeout=120, check=False,
                         env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))})
    assert out.returncode == 0, out.stderr.decode()
    assert out.stdout.split() == [b"1", b"1", b"1"], (out.stdout, out.stderr)
    assert b"the drawing process failed" in out.stderr
