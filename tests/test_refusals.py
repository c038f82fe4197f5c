"""service/refusals.py: refused requests are logged at most once a minute per (uid, reason), with a count of the
rest (one user's loop wrote 35,000 lines a minute). The rules on a clock of the test's; then the real API (in this
process, on a Unix socket, with a real munged) flooded with refused requests."""

from __future__ import annotations

import hashlib
import logging
import subprocess
import time

import pytest
from daemons import start_munged

from slurm_gpueff.service.refusals import Pace


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_flood_of_one_refusal_is_one_line_a_minute_with_its_count():
    clock = Clock()
    pace = Pace(clock=clock)
    key = (1001, "uid 1001 card exit 6")
    written = []
    for i in range(35_000):  # a minute of one user's loop
        clock.now = 1000.0 + i * 59.0 / 35_000
        written += pace.lines(key, f"api POST uid 1001 card exit 6 -> 200 in {i} ms")
    assert written == ["api POST uid 1001 card exit 6 -> 200 in 0 ms"]
    clock.now = 1060.0  # the window closed: the next request of anyone writes its count
    written = pace.lines(None, "api GET health -> 200 in 0 ms")
    assert written == ["refused 34999 more times in the last 60 s, the last: api POST uid 1001 card exit 6 -> 200 "
                       "in 34999 ms", "api GET health -> 200 in 0 ms"]
    assert pace.lines(key, "again") == []  # the count opened the next window: a steady flood is a line a minute
    clock.now = 1121.0
    assert pace.due() == ["refused 1 more time in the last 60 s, the last: again"]
    clock.now = 1190.0  # a window with nothing held back closes silently; the next refusal is logged at once
    assert pace.due() == [] and pace.lines(key, "later") == ["later"]


def test_each_uid_and_reason_has_its_own_window_and_other_requests_are_all_logged():
    clock = Clock()
    pace = Pace(clock=clock)
    assert pace.lines((1001, "r1"), "a") == ["a"]
    assert pace.lines((1002, "r1"), "b") == ["b"]  # another user
    assert pace.lines((1001, "r2"), "c") == ["c"]  # another reason
    assert pace.lines((None, "r1"), "d") == ["d"]  # someone munged did not name
    assert pace.lines((1001, "r1"), "e") == []
    assert [pace.lines(None, f"ok {i}") for i in range(3)] == [["ok 0"], ["ok 1"], ["ok 2"]]
    clock.now += 60
    assert pace.due() == ["refused 1 more time in the last 60 s, the last: e"]


def test_the_kinds_followed_are_bounded():
    clock = Clock()
    pace = Pace(clock=clock, max_keys=3)
    for uid in range(3):
        assert pace.lines((uid, "r"), f"u{uid}") == [f"u{uid}"]
    assert pace.lines((7, "r"), "u7") == ["u7"]  # beyond the bound: all further kinds share one count
    assert pace.lines((8, "r"), "u8") == []
    clock.now += 60
    assert pace.due() == ["refused 1 more time in the last 60 s, the last: u8"]


def test_an_answer_that_is_no_card_is_a_refusal_and_whose(tmp_path):
    """The API itself says which of its answers are refusals (paced in the log) and who asked: a seff-gpu answer
    of an unknown job is (exit 3, uid as munged named it), a ping is not; cards, running jobs and jobs without
    GPUs are answers."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.seff.query import EXIT_NO_GPUS, EXIT_OK, EXIT_RUNNING
    from slurm_gpueff.service import api as api_mod
    from slurm_gpueff.storage.db import make_engine

    db = f"{tmp_path}/g.db"
    make_engine(db).dispose()  # an empty database: no job is known
    api = api_mod.Api(Config({"paths": {"database": db}, "sacct": {"accounting": False}}))
    done = api.seff(1001, b'{"jobid": "99"}')
    assert done.refused and done.what == "uid 1001 card exit 3", done
    assert not api.ping(1001, b"{}").refused
    assert set(api_mod.ANSWERED) == {EXIT_OK, EXIT_RUNNING, EXIT_NO_GPUS}


@pytest.mark.process
def test_the_api_logs_a_flood_of_refusals_once_with_its_count(tmp_path, monkeypatch, caplog):
    """The real API (in this process, its logger captured) with a real munged: 200 requests without a
    credential, 30 with a credential munged made (uid 0) that is no sealed request, and 20 of a method it has
    not, then the window
    closes: three lines when they came and one count each afterwards, where there were 250 lines."""
    from slurm_gpueff.access.client import HEALTH_PATH, SEFF_PATH, request
    from slurm_gpueff.config import Config
    from slurm_gpueff.service import api as api_mod

    class Counted(Pace):
        """The service's Pace, counting the requests it was told of (the API logs after it has answered)."""

        told = 0

        def lines(self, key, line):  # type: ignore[no-untyped-def]
            out = super().lines(key, line)
            Counted.told += 1
            return out

    def settle(requests: int) -> None:
        """Wait until the API has logged this many requests (each line is written just after its answer)."""
        for _ in range(1000):
            if Counted.told >= requests:
                return
            time.sleep(0.01)

    clock = Clock()
    monkeypatch.setattr(api_mod, "REFUSALS", Counted(clock=clock))
    munged, sock = start_munged(str(tmp_path), "munge")
    url = f"unix:{tmp_path}/api.sock"
    cfg = Config({"paths": {"database": f"{tmp_path}/db/gpueff.db", "spool_dir": f"{tmp_path}/spool",
                            "state_dir": f"{tmp_path}/state"},
                  "service": {"api_listen": url, "munge_socket": sock}})
    server = api_mod.start(cfg, None)
    try:
        with caplog.at_level(logging.INFO, logger="gpueff.api"):
            for _ in range(200):
                assert request(url, "POST", SEFF_PATH, b'{"jobid": "1"}', timeout=10).status == 401
            for i in range(30):
                cred = subprocess.run(["munge", "--socket", sock, "--no-input", "--string",
                                       hashlib.sha256(f"no sealed request {i}".encode()).hexdigest()],
                                      capture_output=True, text=True, check=True).stdout.strip()
                reply = request(url, "POST", SEFF_PATH, b'{"jobid": "1"}', {"Authorization": f"MUNGE {cred}"},
                                timeout=10)
                assert reply.status == 401 and reply.reason().startswith("uid 0: "), reply  # munged named the uid
            for _ in range(20):  # refused by http.server itself (no such method): no credential needed either
                assert request(url, "BREW", "/v1/health", timeout=10).status == 501
            settle(250)
            flood = [r.getMessage() for r in caplog.records if r.name == "gpueff.api"]
            clock.now += 60
            assert request(url, "GET", HEALTH_PATH, timeout=10).status == 200
            for _ in range(1000):  # its line is written just after its answer
                if any("api GET health" in r.getMessage() for r in caplog.records):
                    break
                time.sleep(0.01)
            after = [r.getMessage() for r in caplog.records if r.name == "gpueff.api"][len(flood):]
    finally:
        api_mod.stop(server)
        munged.terminate()
        munged.wait(10)
    refused = [line for line in flood if "-> 401" in line]
    assert len(refused) == 2, refused
    assert "seff: missing credential" in refused[0] and "seff: uid 0: " in refused[1]
    assert [line for line in flood if "BREW" in line] == ["api: code 501, message Unsupported method ('BREW')"]
    assert len(after) == 4 and after[-1].startswith("api GET health -> 200"), after
    assert after[2] == "refused 19 more times in the last 60 s, the last: api: code 501, message Unsupported " \
                       "method ('BREW')"
    assert after[0].startswith("refused 199 more times in the last 60 s, the last: api POST seff: missing credential")
    same = refused[1].rpartition(" in ")[0]  # the line but its milliseconds
    assert after[1].startswith(f"refused 29 more times in the last 60 s, the last: {same} in "), (after, same)
