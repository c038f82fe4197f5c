"""One rule per quantity (docs/FIGURES.md, "How figures are printed"), and the same text for a figure on
the terminal card, in the jobs table, in verdict texts, in the mail card and in the monthly summary."""

from __future__ import annotations

import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from record_rows import from_record
from reports_data import config, make_db
from sqlmodel import Session

from slurm_gpueff import fmt
from slurm_gpueff.analysis import assess, job_figures
from slurm_gpueff.config import Config
from slurm_gpueff.render import jobs_table, render_card, render_table
from slurm_gpueff.reports import monthly
from slurm_gpueff.reports.card import build_card
from slurm_gpueff.service.summarize import summary

SCIENTIFIC = re.compile(r"\d[eE][-+]\d")


@pytest.mark.parametrize("fraction, text", [
    (None, "n/a"), (0.0, "0.0%"), (1.0, "100.0%"), (0.42, "42.0%"), (0.327, "32.7%"),
    (0.0076, "0.8%"),  # one decimal from 0.1 % up
    (0.0005, "0.05%"), (0.00012, "0.012%"), (1e-9, "0.0000001%"),  # below: two significant digits, never 0
])
def test_percentages(fraction, text):
    assert fmt.pct(fraction) == text


@pytest.mark.parametrize("hours, text", [
    (None, "n/a"), (0.0, "0.000"), (3.71e-06, "<0.001"), (0.00145, "0.001"), (0.0205, "0.021"), (0.6, "0.600"),
    (0.99951, "1.00"), (2.0, "2.00"), (56.0, "56.00"), (99.999, "100"), (1234.5, "1,234"),
])
def test_gpu_hours_fixed_decimals_by_magnitude(hours, text):
    assert fmt.gpu_hours(hours) == text


def test_no_figure_prints_in_scientific_notation_or_as_zero_when_measured():
    for v in (1e-12, 3.71e-06, 1e-4, 0.004, 0.05):
        for text in (fmt.pct(v), fmt.gpu_hours(v), fmt.gib(v * fmt.GiB), fmt.energy(v), fmt.watts(v)):
            assert not SCIENTIFIC.search(text), text
            assert re.search(r"[1-9]", text), text  # measured and above zero: never reads as 0
    assert fmt.gib(int(12.5 * 1024**2)) == "0.012" and fmt.gib(68 * fmt.GiB) == "68.0" and fmt.gib(None) == "n/a"


def test_other_quantities():
    assert fmt.hms(None) == "n/a" and fmt.hms(59.6) == "00:01:00" and fmt.hms(86400 + 3723) == "1-01:02:03"
    assert fmt.energy(500.0) == "0.5 kJ" and fmt.energy(7.2e6) == "2.00 kWh (7.20 MJ)"
    assert fmt.watts(412.4) == "412 W"
    assert fmt.money(1234.5, "EUR") == "\u20ac1,234" and fmt.money(4.0, "SEK") == "4.00\u00a0SEK"
    assert fmt.money(None, "EUR") == "n/a"
    assert fmt.change(110.0, 100.0) == "+10.0%" and fmt.change(1.0, 0.0) is None
    assert fmt.points(0.5, 0.531) == "\u22123.1 pts" and fmt.points(None, 0.5) is None


def test_job_labels():
    def job(**ids):
        return SimpleNamespace(**{"job_id": 127, "array_job_id": None, "array_task_id": None, "het_job_id": None,
                                  "het_job_offset": None, **ids})

    assert fmt.job_label(job()) == "127"
    assert fmt.job_label(job(array_job_id=123, array_task_id=4)) == "123_4"
    assert fmt.job_label(job(het_job_id=123, het_job_offset=1)) == "123+1"


def test_utc_times_naive_or_aware():
    naive = datetime(2026, 11, 23, 15, 17, 42, 500)
    aware = naive.replace(tzinfo=UTC).astimezone(timezone(timedelta(hours=2)))
    for dt in (naive, aware):
        assert fmt.utc(dt) == "2026-11-23 15:17 UTC" and fmt.iso(dt) == "2026-11-23T15:17:42Z"
    assert fmt.utc(None) == "n/a" and fmt.iso(None) is None


def _job(job_id: int, seconds: float, sm: float, kernel: float = 0.5):
    rec = {"schema": 1, "cluster": "c", "node": "n1", "job_id": job_id, "start_time": 1.7e9,
           "end_time": 1.7e9 + seconds, "backend": "nvml-gpm", "user": "u", "account": "a",
           "gpus": [{"index": 0, "model": "NVIDIA H100", "source": "nvml-gpm", "samples": 10,
                     "kernel_active": kernel, "sm_active": sm, "tensor_active": 0.0, "dram_active": 0.01,
                     "memory_used_peak_bytes": 2 * fmt.GiB, "memory_total_bytes": 80 * fmt.GiB}]}
    job, gpus = from_record(rec)
    fig = job_figures(job, gpus)
    return job, gpus, fig, assess(fig, {"min_gpu_hours": 0.0})


def test_small_sm_activity_reads_the_same_everywhere():
    """SM activity 0.05 %: "0.05%" on the card, in both tables, in the verdict text and in the mail."""
    job, gpus, fig, diag = _job(1, 7200.0, sm=0.0005)
    job = replace(job, **summary(job, gpus, {"min_gpu_hours": 0.0}))
    card = render_card(job, fig, diag)
    assert "SM-active: 0.05%" in card
    assert "0.05%" in render_table([(job, fig, diag)]).splitlines()[-1]
    assert "0.05%" in jobs_table.render([job]).splitlines()[2]
    assert diag.primary is not None and "0.05%" in diag.primary.why
    mail = build_card(job, fig, diag, [], Config())
    assert "SM-active 0.05%" in mail.subject and "SM-active: 0.05%" in mail.text and ">0.05%<" in mail.html()
    for text in (card, render_table([(job, fig, diag)]), jobs_table.render([job]), mail.text, mail.html()):
        assert not re.search(r"SM-active:? 0\.[01]%", text)  # never rounded up, never down to zero


def test_gpu_hours_read_the_same_in_one_column():
    """The column that showed 0.0205, 0.6, 0.00145 and 3.71e-06 GPU-h: now fixed decimals, no exponent."""
    jobs = []
    for n, hours in enumerate((0.0205, 0.6, 0.00145, 3.71e-06), start=1):
        job, gpus, _fig, _diag = _job(n, hours * 3600.0, sm=0.3)
        job = replace(job, **summary(job, gpus, {"min_gpu_hours": 0.0}))
        jobs.append(job)
    table = jobs_table.render(jobs)
    column = [line.split()[4] for line in table.splitlines()[2:6]]
    assert column == ["0.021", "0.600", "0.001", "<0.001"]
    short = [(j, f, d) for j, _g, f, d in (_job(9, 0.00145 * 3600.0, sm=0.3),)]
    assert "GPU-hours allocated: 0.001" in render_card(*short[0])
    assert "0.001" in render_table(short).splitlines()[-1] and not SCIENTIFIC.search(render_table(short))
    mail = build_card(*short[0], [], Config())
    assert ("GPU-hours allocated", "0.001") in mail.context["details"] and not SCIENTIFIC.search(mail.text)


def test_monthly_summary_uses_the_same_rules(tmp_path):
    engine = make_db(tmp_path, [dict(job_id=1, profile="idle", user="u", account="a", hours=0.6),
                                dict(job_id=2, profile="one-sm-spin", user="u", account="a", hours=2.0)])
    with Session(engine) as s:
        summary = monthly.build_summary(s, config(tmp_path), datetime.now(UTC).strftime("%Y-%m"), None)
    assert "for 2.60 GPU-hours" in summary.text and "2.60 GPU-h" in summary.subject
    top = summary.text.split("lost the most GPU-hours:")[1]
    assert re.search(r"\n  1 .* 0\.600 +0\.600 \(100\.0%\)", top), top  # the 0.6 GPU-hour idle job
    assert not SCIENTIFIC.search(summary.text) and not SCIENTIFIC.search(summary.html(""))


# -- sparkline: activity over time on the terminal card --------------------------------------------------

def test_sparkline_bins_by_time():
    # one point per 10 s bucket over 80 s, rising 0 to 1: one cell per point, every level once
    assert fmt.sparkline([(5 + 10 * i, i / 7) for i in range(8)], 80, width=8) == fmt.SPARKS
    # more points than cells: each cell is the mean of the points it covers
    assert fmt.sparkline([(5, 0.0), (15, 1.0), (25, 1.0), (35, 1.0)], 40, width=2) == fmt.SPARKS[4] + fmt.SPARKS[7]


def test_sparkline_coarse_timeline_fills_every_cell():
    cells = fmt.sparkline([(150 + 300 * i, 0.5) for i in range(24)], 7200, width=40)
    assert cells == fmt.SPARKS[4] * 40


def test_sparkline_unknown_is_a_hole_not_a_low_bar():
    pts = [(30 + 60 * i, None if 40 <= i < 80 else 0.9) for i in range(120)]
    cells = fmt.sparkline(pts, 7200, width=12)
    assert cells == fmt.SPARKS[7] * 4 + fmt.NO_DATA * 4 + fmt.SPARKS[7] * 4
    # a real gap (the collector was down): no points at all there
    gap = [(30 + 60 * i, 0.0) for i in range(120) if not 40 <= i < 80]
    assert fmt.sparkline(gap, 7200, width=12) == fmt.SPARKS[0] * 4 + fmt.NO_DATA * 4 + fmt.SPARKS[0] * 4
    assert fmt.sparkline([(5, None), (15, None)], 20, width=4) == fmt.NO_DATA * 4


def test_sparkline_clamps_values_and_times():
    assert fmt.sparkline([(5, 1.7), (15, -0.3)], 20, width=2) == fmt.SPARKS[7] + fmt.SPARKS[0]
    # times outside the span count at its edges
    assert fmt.sparkline([(-50, 1.0), (500, 0.0)], 20, width=2) == fmt.SPARKS[7] + fmt.SPARKS[0]


@pytest.mark.parametrize("points, span", [([], 100.0), ([(5, 0.5)], 0.0), ([(5, 0.5)], -1.0)])
def test_sparkline_empty_input_is_no_line(points, span):
    assert fmt.sparkline(points, span) == ""


def test_sparkline_lone_point_covers_the_span():
    assert fmt.sparkline([(100, 0.5)], 7200, width=5) == fmt.SPARKS[4] * 5


def test_one_line_escapes_every_line_break():
    """An error line holding a value typed by anyone (a --cluster of "\\f" once split an answer's one line in
    two for a program reading it) stays one line whatever break it holds: each one str.splitlines() knows."""
    from slurm_gpueff.fmt import one_line

    for brk, shown in (("\n", "\\n"), ("\r", "\\r"), ("\x0b", "\\u000b"), ("\x0c", "\\u000c"), ("\x1c", "\\u001c"),
                       ("\x1d", "\\u001d"), ("\x1e", "\\u001e"), ("\x85", "\\u0085"), ("\u2028", "\\u2028"),
                       ("\u2029", "\\u2029")):
        assert one_line(f"a{brk}b") == f"a{shown}b"
        assert len(one_line(f"cluster {brk}x{brk}").splitlines()) == 1
    assert one_line("plain \t text") == "plain \t text"
