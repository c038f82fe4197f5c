"""The durable spool: atomic, private, ordered, and nothing deleted that a person might need."""

from __future__ import annotations

import json
import os
import time

import pytest
from hooksite import make_record

from slurm_gpueff import spool


def test_write_record_is_atomic_private_and_complete(tmp_path):
    d = str(tmp_path / "s")
    path = spool.write_record(d, make_record(1))
    assert os.path.basename(path) == "job-1-node01.json"
    with open(path) as fh:
        assert json.load(fh)["job_id"] == 1
    assert os.stat(path).st_mode & 0o777 == 0o600
    for sub in ("", "incoming", "quarantine"):
        assert os.stat(os.path.join(d, sub)).st_mode & 0o777 == 0o700, sub
    assert [n for n in os.listdir(os.path.join(d, "incoming")) if n.startswith(".")] == []


def test_atomic_write_replaces_whole_file_and_cleans_up_on_failure(tmp_path):
    p = str(tmp_path / "f.json")
    spool.atomic_write(p, b"old")
    spool.atomic_write(p, b"new")
    with open(p, "rb") as fh:
        assert fh.read() == b"new"
    missing_dir = str(tmp_path / "nope" / "f.json")
    with pytest.raises(FileNotFoundError):
        spool.atomic_write(missing_dir, b"x")
    assert sorted(os.listdir(tmp_path)) == ["f.json"]


def test_node_names_never_become_paths(tmp_path):
    assert spool.record_name(5, "../../etc/passwd") == "job-5-.._.._etc_passwd.json"
    assert spool.record_name(5, "") == "job-5-node.json"
    path = spool.write_record(str(tmp_path), make_record(5, node="a/b"))
    assert os.path.dirname(path) == os.path.join(str(tmp_path), "incoming")


def test_pending_is_oldest_first_skips_temp_files_and_shows_everything_else(tmp_path):
    """Hidden temp files are a writer's; any other entry is listed, so that ingest quarantines what it does not
    take (a stray file is never left unseen)."""
    d = str(tmp_path)
    a = spool.write_record(d, make_record(1))
    b = spool.write_record(d, make_record(2))
    os.utime(a, (time.time(), time.time() + 10))  # a is now the newest
    with open(os.path.join(d, "incoming", ".tmp-123-abc"), "w") as fh:
        fh.write("{")
    notes = os.path.join(d, "incoming", "notes.txt")
    with open(notes, "w") as fh:
        fh.write("x")
    os.utime(notes, (time.time(), time.time() + 20))
    assert list(spool.pending(d)) == [b, a, notes]
    assert list(spool.pending(str(tmp_path / "absent"))) == []


def test_quarantine_keeps_file_and_reason_and_never_overwrites(tmp_path):
    d = str(tmp_path)
    first = spool.write_record(d, make_record(1))
    q1 = spool.quarantine(d, first, "bad thing")
    second = spool.write_record(d, make_record(1, user="bob"))
    q2 = spool.quarantine(d, second, "other thing")
    assert q1 != q2 and not os.path.exists(first)
    with open(q1 + ".error") as fh:
        assert fh.read() == "bad thing\n"
    with open(q2) as fh:
        assert json.load(fh)["user"] == "bob"


def temp_files(d: str) -> str:
    """A two-hour-old ``.tmp-old`` and a fresh ``.tmp-new`` in ``d``'s incoming/; returns the old one."""
    spool.ensure_dirs(d)
    inc = os.path.join(d, "incoming")
    old, new = os.path.join(inc, ".tmp-old"), os.path.join(inc, ".tmp-new")
    for p in (old, new):
        with open(p, "w") as fh:
            fh.write("{")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    return old


def test_pending_by_job_keeps_a_jobs_records_together_in_arrival_order(tmp_path, monkeypatch):
    """A job's node records come together, oldest first (ingest's "latest wins" merge depends on it), jobs
    in job id order, and only jobs with several records are stat-ed: single-node jobs need no stat."""
    d = str(tmp_path)
    now = time.time()
    written = {}
    for job, node, age in ((9, "n0", 50), (7, "b", 30), (7, "a", 10), (10, "n0", 1), (7, "c", 20), (8, "n0", 5)):
        p = spool.write_record(d, make_record(job, node=node))
        os.utime(p, (now - age, now - age))
        written[(job, node)] = p
    odd = os.path.join(d, "incoming", "copied-by-hand.json")
    with open(odd, "w") as fh:
        fh.write("{}")
    stale, fresh = (os.path.join(d, "incoming", f".tmp-{n}") for n in ("stale", "fresh"))
    for p in (stale, fresh):
        with open(p, "w") as fh:
            fh.write("{")
    os.utime(stale, (now - 7200, now - 7200))
    stats: list[str] = []
    real_stat = os.lstat  # entries are never followed: a link is quarantined as what it is

    def counted(path, *a, **k):  # noqa: ANN001, ANN202
        stats.append(os.path.basename(path))
        return real_stat(path, *a, **k)

    monkeypatch.setattr(os, "lstat", counted)
    groups = spool.pending_by_job(d, stale_tmp_s=3600)
    monkeypatch.undo()
    # jobs in job id order (10 after 9: numeric), the hand-named file last
    assert groups == [[written[(7, n)] for n in "bca"], *([written[(j, "n0")]] for j in (8, 9, 10)), [odd]]
    assert sorted(stats) == sorted(["job-7-a.json", "job-7-b.json", "job-7-c.json", ".tmp-stale", ".tmp-fresh"])
    assert not os.path.exists(stale) and os.path.exists(fresh)  # removed in the same pass, the fresh one kept
    assert spool.pending_by_job(str(tmp_path / "absent")) == []


def test_group_by_job_keeps_the_given_order():
    paths = ["/s/job-1-b.json", "/s/job-2-a.json", "/s/x.json", "/s/job-1-a.json", "/s/job-x-y-z.json"]
    assert spool.group_by_job(paths) == [["/s/job-1-b.json", "/s/job-1-a.json"], ["/s/job-2-a.json"],
                                         ["/s/x.json"], ["/s/job-x-y-z.json"]]


def test_pending_with_stale_tmp_s_removes_only_old_temp_files_in_the_same_pass(tmp_path):
    """Ingest lists with pending() (or pending_by_job()): temp files left by a writer that died go in that
    pass; fresh ones stay, and so does a record, however old."""
    d = str(tmp_path)
    rec = spool.write_record(d, make_record(1))
    os.utime(rec, (time.time() - 7200, time.time() - 7200))
    old = temp_files(d)
    inc = os.path.join(d, "incoming")
    assert list(spool.pending(d)) == [rec] and os.path.exists(old)  # without it, nothing is removed
    before = set(os.listdir(inc))
    assert list(spool.pending(d, stale_tmp_s=spool.STALE_TMP_S)) == [rec]
    assert before - set(os.listdir(inc)) == {".tmp-old"}  # exactly one file removed
    assert sorted(os.listdir(inc)) == [".tmp-new", "job-1-node01.json"]
