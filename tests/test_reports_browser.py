"""A card and a monthly summary, as archived, opened in headless Chromium (Debian's ``chromium``).

Checks that the page really renders: a screenshot that is not blank, and the chart image decoded by
the browser (its naturalWidth, read back from the DOM after load). The GPU figures are simulated; the
browser, the files and everything between are real.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest
from reports_data import config, make_db

from slurm_gpueff.reports import runner, sentlog

pytestmark = pytest.mark.browser

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars"]


def chromium() -> str:
    path = shutil.which("chromium")
    assert path, "chromium is not installed (apt-get install chromium; .ci/run does this)"
    return path


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{os.urandom(4).hex()}"
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                          text=True, timeout=90, check=False)


def screenshot(tmp_path, html: str, name: str, height: int = 1800):
    import matplotlib.image as mpimg

    png = tmp_path / f"{name}.png"
    proc = run_chromium(tmp_path, f"--screenshot={png}", f"--window-size=760,{height}", f"file://{html}")
    assert png.exists(), proc.stderr[-2000:]
    return mpimg.imread(str(png))  # floats in [0, 1], H x W x 3|4


def chart_width_in_dom(tmp_path, html: str) -> int:
    """Load a copy of the page with a tiny script that writes the chart's decoded width into the DOM."""
    with open(html, encoding="utf-8") as fh:
        page = fh.read()
    probe = ("<script>window.addEventListener('load',function(){var i=document.images[0];"
             "document.body.setAttribute('data-chart',i&&i.complete?i.naturalWidth:-1);});</script>")
    copy = os.path.join(os.path.dirname(html), "probe.html")
    with open(copy, "w", encoding="utf-8") as fh:
        fh.write(page.replace("</body>", probe + "</body>"))
    proc = run_chromium(tmp_path, "--dump-dom", f"file://{copy}")
    m = re.search(r'data-chart="(-?\d+)"', proc.stdout)
    assert m, proc.stdout[-2000:] + proc.stderr[-2000:]
    return int(m.group(1))


def not_blank(img) -> None:
    rgb = img[..., :3]
    assert rgb.std() > 0.05, "screenshot is (nearly) one colour"
    colours = {tuple(int(255 * c) for c in px) for px in rgb[::7, ::7].reshape(-1, 3)}
    assert len(colours) > 50, "too few colours: text and chart did not render"


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("browser")
    engine = make_db(tmp, [
        dict(job_id=201, profile="one-of-n-gpus", user="bob", account="physics", gpus=4, hours=3.0),
        dict(job_id=202, profile="starved", user="alice", account="physics", hours=2.0),
        dict(job_id=203, profile="bf16-healthy", user="carol", account="vision", hours=4.0),
    ], names={201: "<b>bold</b> & train"})
    cfg = config(tmp, price_per_gpu_hour={"default": 2.5})
    assert runner.send_cards(cfg, engine, dry_run=True).written == 2
    month = sentlog.utcnow().strftime("%Y-%m")
    assert runner.send_monthly(cfg, engine, month=month, dry_run=True).written == 3  # physics, vision, site
    card = glob.glob(str(tmp / "reports/dry-run/cards/*/c-201/card.html"))[0]
    summary = glob.glob(str(tmp / "reports/dry-run/monthly/*/site/summary.html"))[0]
    return tmp, card, summary


def test_card_renders_with_chart(archive):
    tmp, card, _ = archive
    img = screenshot(tmp, card, "card", height=2000)
    not_blank(img)
    assert chart_width_in_dom(tmp, card) == 1200  # the PNG decoded (2x of the 600 px shown)
    dom = run_chromium(tmp, "--dump-dom", f"file://{card}").stdout
    assert "&lt;b&gt;bold&lt;/b&gt; &amp; train" in dom and "<b>bold</b>" not in dom  # name shown as text
    assert "1 of 4 GPUs did all the work" in dom


def test_monthly_summary_renders_with_chart(archive):
    tmp, _, summary = archive
    img = screenshot(tmp, summary, "summary", height=2000)
    not_blank(img)
    assert chart_width_in_dom(tmp, summary) == 1200
    dom = run_chromium(tmp, "--dump-dom", f"file://{summary}").stdout
    for text in ("all accounts", "jobs that lost the most GPU-hours", "GPUs by verdict", "physics",
                 "vision"):
        assert text in dom, text
