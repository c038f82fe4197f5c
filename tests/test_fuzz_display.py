"""Text from records holding control and bidirectional characters: what reaches the terminal or a file
(seff-gpu's card, ``-u`` table, ``--json``, ``--html``) never holds ESC, BEL, another C0/C1 control
character or a bidi control as itself, only as its ``\\uXXXX`` escape. The hooks clean their environment,
but a record can reach the spool another way. The fuzz test (Hypothesis; at least the profile's count:
1,000 in CI, 10,000 with ``deep``) covers the one boundary every display passes, ``fmt.visible``; the
others run one record holding every such character through ingest, the database and the CLI's own code.
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from sites import ingest_records, sim_record, site_config
from test_fuzz_spool import CASES, FUZZ

from slurm_gpueff.cli import seff
from slurm_gpueff.fmt import UNSEEN, visible
from slurm_gpueff.storage.db import make_engine

NASTY = "\x1b\x07\x00\x08\x0b\x0c\r\x1b[2J\x7f\x85\x9b\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e" \
        "\u2066\u2067\u2068\u2069"
texts = st.text(alphabet=st.sampled_from(NASTY + "abcé漢 -_."), min_size=1, max_size=24)


@pytest.mark.fuzz
def test_visible_leaves_no_control_or_bidi_character_and_hides_nothing():
    """The one boundary every display goes through (seff-gpu's emit): any text comes out with no unseen
    character, printable text unchanged, and each unseen one as its escape (nothing dropped)."""
    seen = {"n": 0, "escaped": 0}

    @FUZZ
    @given(st.one_of(st.text(max_size=60), texts))
    def check(text: str) -> None:
        out = visible(text)
        assert not UNSEEN.search(out)
        assert len(out) == len(text) + 5 * len(UNSEEN.findall(text))
        if not UNSEEN.search(text):
            assert out == text
        seen["n"] += 1
        seen["escaped"] += out != text

    check()
    assert seen["n"] >= CASES and seen["escaped"], seen


def test_no_control_or_bidi_character_reaches_a_display(tmp_path):
    """Through ingest, the real database and seff-gpu's own code: the card, --json, --html and the -u table
    of a job whose user, account, job name, partition and node hold every unseen character."""
    engine = make_engine(str(tmp_path / "gpueff.db"))
    config = str(site_config(tmp_path, tmp_path / "gpueff.db"))
    (tmp_path / "run" / "jobs").mkdir(parents=True)
    html = tmp_path / "card.html"
    user = "al" + NASTY + "ice"
    rec = sim_record(1001, user=user, account="ac" + NASTY, partition="p" + NASTY, node="n" + NASTY,
                     job_name="job" + NASTY)
    assert ingest_records(engine, tmp_path / "spool", [rec]).ingested == 1
    engine.dispose()
    for argv in (["1001"], ["1001", "--json"], ["1001", "--html", str(html)],
                 [f"--user={user}", "-S", "2020-01-01", "-E", "2030-01-01"]):
        out, err = io.StringIO(), io.StringIO()
        with redirect_stdout(out), redirect_stderr(err):
            assert seff.main(["--config", config, *argv]) == 0, err.getvalue()
        shown = out.getvalue() + err.getvalue() + (html.read_text() if "--html" in argv else "")
        assert not UNSEEN.search(shown), (argv, repr(shown[:400]))
        assert "\\u001b" in shown or "--json" in argv, (argv, shown[:400])
        if "--json" in argv:
            assert json.loads(out.getvalue())["jobs"][0]["job"]["user"] == user  # still the same JSON value


def test_a_records_escape_sequence_is_shown_not_obeyed(tmp_path, capsys):
    """The card of a job whose name holds a clear-screen and a right-to-left override, as a user sees it."""
    engine = make_engine(str(tmp_path / "gpueff.db"))
    config = str(site_config(tmp_path, tmp_path / "gpueff.db"))
    (tmp_path / "run" / "jobs").mkdir(parents=True)
    ingest_records(engine, tmp_path / "spool", [sim_record(7, user="alice", account="vis\u202eion",
                                                           job_name="train\x1b[2J\x07")])
    engine.dispose()
    assert seff.main(["--config", config, "7"]) == 0
    card = capsys.readouterr().out
    assert "vis\\u202eion" in card and "\x1b" not in card and "\u202e" not in card
    assert Path(config).exists()


def test_mail_keeps_a_name_on_one_line_without_unseen_characters():
    """The mail's subject and text name the job and its owner through card.clean: one line, nothing unseen."""
    from slurm_gpueff.reports.card import clean

    out = clean("train" + NASTY + "run", 200)
    assert not UNSEEN.search(out) and "\n" not in out and out.startswith("train") and out.endswith("run")
