"""Per-job cards and monthly summaries through a real SMTP server (aiosmtpd) on loopback.

Nothing is mocked but the GPUs (the simulated collector makes the job figures); the mail goes through
smtplib to a real SMTP server, and the assertions are on the MIME messages it received.
"""

from __future__ import annotations

import os
import re
from datetime import timedelta

import pytest
from reports_data import EVIL_NAME, config, enrich, make_db
from smtputil import free_port
from sqlmodel import Session, select

from slurm_gpueff.config import Config
from slurm_gpueff.models import ReportLog
from slurm_gpueff.reports import runner, sentlog
from slurm_gpueff.reports.cards_due import CARD_ENRICH_WAIT_H
from slurm_gpueff.service.summarize import summarize_pending

pytestmark = pytest.mark.smtp


def mail_config(tmp_path, port, leads=None, **reports):
    cfg = config(tmp_path, leads, **reports)
    mail = {"host": "127.0.0.1", "port": port, "from_address": "gpueff@cluster.example"}
    return Config({**cfg.as_dict(), "mail": {**cfg.mail.as_dict(), **mail}})


JOBS = [
    dict(job_id=101, profile="one-sm-spin", user="alice", account="physics", hours=2.0),
    dict(job_id=102, profile="idle", user="alice", account="physics", hours=3.0),
    dict(job_id=103, profile="starved", user="alice", account="physics", hours=1.5),
    dict(job_id=104, profile="one-of-n-gpus", user="bob", account="physics", gpus=4, hours=2.0),
    dict(job_id=105, profile="bf16-healthy", user="carol", account="vision", hours=5.0),
    dict(job_id=106, profile="tiny-kernels", user="dave", account="vision", hours=0.5),  # under the minimum
]


def parts_of(msg):
    """(text/plain, text/html, {content-id: png bytes}) of a received message."""
    text = html = None
    images = {}
    for part in msg.walk():
        ctype = part.get_content_type()
        if ctype == "text/plain":
            text = part.get_content().replace("\r\n", "\n")
        elif ctype == "text/html":
            html = part.get_content().replace("\r\n", "\n")
        elif ctype == "image/png":
            images[part["Content-ID"].strip("<>")] = part.get_payload(decode=True)
    return text, html, images


def test_cards_arrive_with_both_parts_inline_chart_and_escaped_name(tmp_path, smtp_server):
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS, names={104: EVIL_NAME})
    cfg = mail_config(tmp_path, port, address_pattern="{user}@uni.example", card_max_per_user_per_day=10)
    result = runner.send_cards(cfg, engine)
    assert result.failed == 0 and result.skipped == 0
    # healthy 105 and the 0.5 GPU-hour 106 get no card (only unhealthy, min 1 GPU-hour)
    got = {m["X-Gpueff-Job"]: (rcpt, m) for rcpt, m in inbox.messages}
    assert set(got) == {"c:101", "c:102", "c:103", "c:104"}
    rcpt, msg = got["c:104"]
    assert rcpt == ["bob@uni.example"] and msg["To"] == "bob@uni.example"
    assert msg.get_content_type() == "multipart/alternative"
    text, html, images = parts_of(msg)
    assert text and html and len(images) == 1
    (cid, png), = images.items()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 5000
    assert f'src="cid:{cid}"' in html  # the chart is referenced from the HTML by its Content-ID
    assert "http://" not in html and "https://" not in html and "<style" not in html  # no remote content
    # The job name cannot inject markup ...
    assert "<script>" not in html and "&lt;script&gt;" in html
    # ... nor headers: no Bcc header, nothing but our headers, subject on one line.
    assert msg["Bcc"] is None
    assert "\n" not in msg["Subject"] and "\r" not in msg["Subject"]
    assert "victim@evil.example" not in rcpt
    # ... nor lines in the plain-text part: the name stays on the line where it is quoted.
    assert not any(line.startswith("Bcc:") for line in text.splitlines())
    assert "1 of 4 GPUs did all the work" in text and "1 of 4 GPUs did all the work" in html
    assert "Verdict: 3 of 4 GPUs never used" in text


def test_plain_text_part_reads_on_its_own(tmp_path, smtp_server):
    """The plain-text part alone: every key fact in words, no markup, lines that fit a terminal."""
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS[:1])
    cfg = mail_config(tmp_path, port, price_per_gpu_hour={"default": 2.0}, currency="EUR",
                      contact="Questions: hpc-support@uni.example")
    runner.send_cards(cfg, engine)
    (_, msg), = inbox.messages
    text, _, _ = parts_of(msg)
    for fact in ("Hello alice,", "Your Slurm job 101", "GPU-hours allocated: 2.00", "Kernel-active: 100.0%",
                 "SM-active: 0.", "Verdict: Busy but not working", "Things to try:", "Cost of the 2.00 GPU-hours",
                 "\u20ac4.00", "nvidia-smi calls \"GPU utilization\"", "gpueff report optout alice",
                 "Questions: hpc-support@uni.example"):
        assert fact in text, f"{fact!r} not in:\n{text}"
    assert not re.search(r"<[a-z/][^>]*>|&[a-z]+;|\{\{|\{%|None", text)
    assert max(len(line) for line in text.splitlines()) <= 80


def test_no_duplicate_on_second_run(tmp_path, smtp_server):
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS[:2])
    cfg = mail_config(tmp_path, port)
    assert runner.send_cards(cfg, engine).sent == 2
    assert runner.send_cards(cfg, engine).sent == 0
    assert len(inbox.messages) == 2
    # A dry run afterwards writes files but does not mail; a real run after a dry run still mails once.
    assert runner.send_cards(cfg, engine, dry_run=True).written == 2
    assert len(inbox.messages) == 2


def test_rate_limit_keeps_the_most_wasteful_cards(tmp_path, smtp_server):
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS[:3])  # three unhealthy jobs of alice
    cfg = mail_config(tmp_path, port, card_max_per_user_per_day=2)
    result = runner.send_cards(cfg, engine)
    assert (result.sent, result.skipped) == (2, 1)
    sent = {m["X-Gpueff-Job"] for _, m in inbox.messages}
    assert sent == {"c:101", "c:102"}  # 103 (starved, 1.5 GPU-h) wasted the least
    with Session(engine) as s:
        skipped = s.exec(select(ReportLog).where(ReportLog.status == "skipped")).one()
    assert skipped.subject == "c:103" and "rate limit" in (skipped.reason or "")
    assert runner.send_cards(cfg, engine).sent == 0  # not reconsidered


def test_opt_out_is_honoured(tmp_path, smtp_server):
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS[:4])
    optout_file = tmp_path / "optout.txt"
    optout_file.write_text("# users who asked for no cards\nbob\n")
    cfg = mail_config(tmp_path, port, card_max_per_user_per_day=0, optout_file=str(optout_file))
    with Session(engine) as s:
        assert sentlog.set_optout(s, ["alice"], True) == ["alice"]
    result = runner.send_cards(cfg, engine)
    assert result.sent == 0 and result.skipped == 4
    assert inbox.messages == []


def test_failed_send_is_kept_and_retried(tmp_path, smtp_server):
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS[:1])
    dead = mail_config(tmp_path, free_port())  # nobody listens there
    dead = Config({**dead.as_dict(), "mail": {**dead.mail.as_dict(), "retries": 2}})
    result = runner.send_cards(dead, engine)
    assert result.failed == 1 and inbox.messages == []
    with Session(engine) as s:
        row = s.exec(select(ReportLog)).one()
    assert row.status == "failed" and row.next_try_at is not None and row.archive
    live = mail_config(tmp_path, port, )
    assert runner.retry_failed(live, engine, now=row.next_try_at).sent == 1
    assert len(inbox.messages) == 1
    assert runner.send_cards(live, engine).sent == 0  # never twice


def test_monthly_summary_to_leads_and_admins(tmp_path, smtp_server):
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS)
    cfg = mail_config(tmp_path, port, leads={"physics": ["pi_smith", "deputy"]}, admins=["admin@uni.example"],
                      address_pattern="{user}@uni.example", addresses={"deputy": "d.deputy@lab.example"},
                      coordinators_as_leads=False)
    month = sentlog.utcnow().strftime("%Y-%m")
    result = runner.send_monthly(cfg, engine, month=month)
    assert result.sent == 2  # physics (has leads) + site; vision has no lead configured
    by_to = {tuple(rcpt): m for rcpt, m in inbox.messages}
    physics = by_to[("pi_smith@uni.example", "d.deputy@lab.example")]
    text, html, images = parts_of(physics)
    assert "account physics" in physics["Subject"]
    assert len(images) == 1 and f'src="cid:{next(iter(images))}"' in html
    assert "jobs that lost the most GPU-hours" in text and "Top 3 things to change" in text
    assert "carol" not in text  # another account's user
    assert max(len(line) for line in text.splitlines()) <= 80, text
    site_text, _, _ = parts_of(by_to[("admin@uni.example",)])
    assert "all accounts" in site_text and "vision" in site_text
    assert runner.send_monthly(cfg, engine, month=month).sent == 0  # never twice


def test_cards_wait_for_enrichment_so_the_mail_has_the_real_state(tmp_path, smtp_server):
    """An Epilog sees a TIMEOUT exit 0: a card mailed before sacct enrichment would say COMPLETED. The card
    waits for enrichment; a job never enriched goes out after CARD_ENRICH_WAIT_H, saying it is pending."""
    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS[:2], enriched=False)  # hook records only, ended an hour ago
    cfg = mail_config(tmp_path, port)
    assert runner.send_cards(cfg, engine).sent == 0 and inbox.messages == []
    enrich(engine, {101: "TIMEOUT"})  # sacct's final state of 101; 102 unknown to accounting
    summarize_pending(engine)
    assert runner.send_cards(cfg, engine).sent == 1
    (_, msg), = inbox.messages
    text, html, _ = parts_of(msg)
    assert msg["X-Gpueff-Job"] == "c:101" and "TIMEOUT (exit code 0)" in text and "TIMEOUT" in html
    assert "COMPLETED" not in text and "pending" not in text
    later = sentlog.utcnow() + timedelta(hours=CARD_ENRICH_WAIT_H)
    assert runner.send_cards(cfg, engine, now=later).sent == 1
    _, msg = inbox.messages[1]
    text, _, _ = parts_of(msg)
    assert msg["X-Gpueff-Job"] == "c:102" and "final state not read from accounting yet" in " ".join(text.split())
    assert "COMPLETED" not in text


def test_one_leads_entry_sees_the_accounts_jobs_and_gets_its_summary(tmp_path, smtp_server):
    """[leads] physics = ["pi_smith"]: pi_smith (who ran none of them) may see physics's jobs and no other
    account's, and physics's monthly summary goes to pi_smith at the address reports.address_pattern makes."""
    from slurm_gpueff.access.privacy import may_see, shown, viewer
    from slurm_gpueff.models import Job

    inbox, port = smtp_server
    engine = make_db(tmp_path, JOBS)
    cfg = mail_config(tmp_path, port, leads={"physics": ["pi_smith"]}, address_pattern="{user}@uni.example",
                      coordinators_as_leads=False)
    lead = viewer(cfg, 2001, "pi_smith", coordinators=lambda: {})
    with Session(engine) as s:
        jobs = s.exec(select(Job)).all()
    seen, hidden = shown([(j, []) for j in jobs], lead)
    assert sorted(j.job_id for j, _g in seen) == [101, 102, 103, 104] and hidden == 2  # physics's, not vision's
    assert not any(may_see(viewer(cfg, 2002, "someone", coordinators=lambda: {}), j) for j in jobs)
    month = sentlog.utcnow().strftime("%Y-%m")
    result = runner.send_monthly(cfg, engine, month=month, site=False)
    assert result.sent == 1, result.lines  # vision: nobody leads it (and coordinators are not asked)
    (rcpt, msg), = inbox.messages
    assert rcpt == ["pi_smith@uni.example"] and msg["To"] == "pi_smith@uni.example"
    assert "account physics" in msg["Subject"]


def sacctmgr_on_path(tmp_path, monkeypatch, output: str, mode: str = "") -> None:
    """tests/fake_slurm_cmd.py as ``sacctmgr`` first on PATH, printing ``output`` (or failing: ``mode``)."""
    from test_seff_rawid import install_fake

    install_fake(tmp_path / "bin", "sacctmgr")
    (tmp_path / "sacctmgr.psv").write_text(output)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SACCTMGR_FILE", str(tmp_path / "sacctmgr.psv"))
    monkeypatch.setenv("FAKE_SLURM_MODE", mode)


def test_monthly_summary_to_account_coordinators(tmp_path, smtp_server, monkeypatch):
    """vision has no [leads]: its Slurm coordinators (bob, carol) get it, addressed like card owners;
    physics keeps its configured lead although bob coordinates it too."""
    from test_slurmcmds import WITH_COORDS

    inbox, port = smtp_server
    sacctmgr_on_path(tmp_path, monkeypatch, WITH_COORDS)
    monkeypatch.setenv("FAKE_SLURM_LOG", str(tmp_path / "calls"))
    engine = make_db(tmp_path, JOBS)
    month = sentlog.utcnow().strftime("%Y-%m")
    off = mail_config(tmp_path, port, coordinators_as_leads=False)
    assert runner.send_monthly(off, engine, month=month, site=False).sent == 0  # no leads: nobody
    assert not (tmp_path / "calls").exists()  # and sacctmgr was not asked
    cfg = mail_config(tmp_path, port, leads={"physics": ["pi_smith"]}, address_pattern="{user}@uni.example",
                      addresses={"carol": "carol.c@uni.example"})
    result = runner.send_monthly(cfg, engine, month=month, site=False)
    assert result.sent == 2, result.lines
    by_to = {tuple(rcpt): m for rcpt, m in inbox.messages}
    assert set(by_to) == {("pi_smith@uni.example",), ("bob@uni.example", "carol.c@uni.example")}
    assert "account vision" in by_to[("bob@uni.example", "carol.c@uni.example")]["Subject"]
    assert (tmp_path / "calls").read_text().count("sacctmgr") == 1  # one call for all accounts


def test_monthly_summaries_survive_a_sacctmgr_failure(tmp_path, smtp_server, monkeypatch, caplog):
    inbox, port = smtp_server
    sacctmgr_on_path(tmp_path, monkeypatch, "", mode="fail")
    engine = make_db(tmp_path, JOBS)
    cfg = mail_config(tmp_path, port, leads={"physics": ["pi_smith"]}, admins=["admin@uni.example"],
                      address_pattern="{user}@uni.example")
    result = runner.send_monthly(cfg, engine, month=sentlog.utcnow().strftime("%Y-%m"))
    assert result.sent == 2  # physics's lead and the site summary; vision has nobody
    assert {tuple(rcpt) for rcpt, _m in inbox.messages} == {("pi_smith@uni.example",), ("admin@uni.example",)}
    why = next(line for line in result.lines if "coordinators unknown" in line)
    assert "sacctmgr failed (exit 1)" in why and "Connection refused" in why
    assert "coordinators unknown" in caplog.text


class Refusing:
    """aiosmtpd handler that refuses every message with a transient error, counting the tries."""

    def __init__(self) -> None:
        self.tries = 0

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's hook name
        self.tries += 1
        return "451 4.3.0 try again later"


def test_failed_mail_is_retried_once_per_tick(tmp_path):
    """The service's card task: a message the server keeps refusing is tried once per tick, not twice."""
    from aiosmtpd.controller import Controller

    from slurm_gpueff.service.tasks import Context, report_cards

    handler = Refusing()
    port = free_port()
    ctl = Controller(handler, hostname="127.0.0.1", port=port)
    ctl.start()
    try:
        engine = make_db(tmp_path, JOBS[:1])
        cfg = mail_config(tmp_path, port, cards=True)
        # one try per run, and every failure is due again at once
        cfg = Config({**cfg.as_dict(), "mail": {**cfg.mail.as_dict(), "retries": 1, "retry_after_s": 0.0}})
        tries = []
        for _tick in range(3):
            before = handler.tries
            report_cards(Context(cfg, engine))
            tries.append(handler.tries - before)
    finally:
        ctl.stop()
    assert tries == [1, 1, 1]
    with Session(engine) as s:
        row = s.exec(select(ReportLog)).one()
    assert row.status == "failed" and row.attempts == 3 and "451" in (row.reason or "")
