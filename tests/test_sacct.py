"""The sacct reader's parsers, on output captured from a real Slurm 22.05 (tests/data/sacct/, see README there).

No Slurm needed: these are the pure functions. Running the real sacct is tests/slurm/ (marker ``slurm``).
"""

from __future__ import annotations

import os

import pytest

from slurm_gpueff.config import Config
from slurm_gpueff.slurm.hookenv import parse_exit_text
from slurm_gpueff.slurm.sacct import (
    SacctError,
    SacctReader,
    expand_hostlist,
    parse_exit_codes,
    parse_json,
    parse_parsable,
    parse_tres,
    state_word,
)

DATA = os.path.join(os.path.dirname(__file__), "data", "sacct")


def read(name: str) -> str:
    with open(os.path.join(DATA, name)) as fh:
        return fh.read()


def by_id(jobs):
    return {j.job_id: j for j in jobs}


def test_json_fields_from_real_output():
    jobs, meta = parse_json(read("sacct-22.05-json.json"))
    j = by_id(jobs)
    assert meta["plugin"]["type"] == "openapi/dbv0.0.38"
    assert set(j) == {11, 12, 13, 14, 15, 16, 17, 18, 19}
    one = j[11]
    assert (one.user, one.account, one.partition, one.qos, one.job_name, one.cluster) == (
        "alice", "research", "debug", "normal", "one-gpu", "gpueffci")
    assert (one.gpu_count, one.gpu_type, one.state, one.nodes) == (1, "simh100", "COMPLETED", ["vm"])
    assert one.elapsed_s == 2.0
    assert one.start == 1795357228.0 and one.end == 1795357230.0 and one.submit == 1795357225.0
    assert (j[12].gpu_count, j[13].gpu_count, j[13].gpu_type) == (2, 0, None)  # AllocTRES, not ReqTRES
    assert j[14].job_name == "exit|3" and j[14].state == "FAILED"
    # 22.05's --json says exit 0 for the job that exited 3: the reader must not trust it (see parse_exit_codes)
    assert j[14].exit_code == 0
    assert (j[19].job_id_text, j[19].array_job_id, j[19].array_task_id) == ("15_0", 15, 0)
    assert (j[15].job_id_text, j[15].array_job_id, j[15].array_task_id) == ("15_1", 15, 1)
    assert (j[17].job_id_text, j[17].het_job_id, j[17].het_job_offset) == ("16+1", 16, 1)
    assert j[17].state == "CANCELLED" and j[17].start is None and not j[17].nodes  # cancelled while pending
    assert j[11].het_job_id is None and j[11].array_job_id is None and j[11].uid is None  # json has no uid


def test_parsable_fields_from_real_output():
    j = by_id(parse_parsable(read("sacct-22.05-parsable.txt"), delimiter="|"))
    assert set(j) == {11, 12, 13, 14, 15, 16, 17, 18, 19}
    assert (j[11].uid, j[12].uid, j[14].exit_code, j[14].signal) == (1001, 0, 3, 0)
    assert j[14].job_name == "exit|3"  # the delimiter inside the last field is kept
    assert (j[19].array_job_id, j[19].array_task_id, j[17].het_job_id, j[17].het_job_offset) == (15, 0, 16, 1)
    assert j[16].state == "PENDING" and not j[16].final and j[16].start is None and j[16].end is None
    # cancelled while pending: "CANCELLED by 0", no GPUs held although it asked for one
    assert (j[18].state, j[18].state_text, j[18].gpu_count, j[18].final) == ("CANCELLED", "CANCELLED by 0", 0, True)
    assert (j[12].gpu_count, j[12].gpu_type, j[12].start, j[12].end) == (2, "simh100", 1795357228.0, 1795357230.0)


def test_json_and_parsable_agree_on_the_same_jobs():
    a = by_id(parse_json(read("sacct-22.05-json.json"))[0])
    b = by_id(parse_parsable(read("sacct-22.05-parsable.txt"), delimiter="|"))
    for i in (11, 12, 13, 14, 15, 19):
        for k in ("job_id_text", "user", "account", "qos", "job_name", "gpu_count", "gpu_type", "start", "end",
                  "state", "array_job_id", "array_task_id", "nodelist"):
            assert getattr(a[i], k) == getattr(b[i], k), (i, k)


def test_exit_codes_query():
    codes = parse_exit_codes(read("sacct-22.05-exitcodes.txt"))
    assert codes[(14, None)] == (3, 0) and codes[(11, None)] == (0, 0) and len(codes) == 9


@pytest.mark.parametrize("text, count, kind", [
    ("billing=1,cpu=1,gres/gpu:simh100=2,gres/gpu=2,node=1", 2, "simh100"),
    ("cpu=4,gres/gpu=3,node=1", 3, None),
    ("cpu=4,gres/gpu:a100=1,gres/gpu:h100=2", 3, "a100,h100"),  # only typed TRES accounted
    ("cpu=1,mem=4G,node=1", 0, None),
    ("", 0, None),
    (None, 0, None),
    ("gres/gpumem=80G,gres/gpu=1", 1, None),
])
def test_tres(text, count, kind):
    assert parse_tres(text) == (count, kind)


def test_small_parsers():
    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    assert expand_hostlist("None assigned") == [] and expand_hostlist("n[8-10]") == ["n8", "n9", "n10"]
    assert parse_exit_text("3:0") == (3, 0) and parse_exit_text("0:15") == (0, 15)
    assert parse_exit_text("") == (None, None)
    assert state_word("CANCELLED by 1001") == "CANCELLED" and state_word(None) is None


def test_garbage_is_a_clear_error():
    with pytest.raises(SacctError, match="not JSON"):
        parse_json("sacct: error: Problem talking to the database")
    with pytest.raises(SacctError, match="reported errors"):
        parse_json('{"meta": {}, "errors": [{"error": "boom", "error_number": 1}], "jobs": []}')
    nothing = '{"meta": {}, "errors": [{"error": "Nothing found with query", "error_number": 9003}], "jobs": []}'
    assert parse_json(nothing) == ([], {})
    assert parse_parsable("sacct: warning: something\n\n") == []


def test_absent_sacct_is_a_clear_error(tmp_path):
    reader = SacctReader(command=str(tmp_path / "no-such-sacct"))
    with pytest.raises(SacctError, match="sacct not found"):
        reader.jobs([1, 2])
    reader = SacctReader(command="no-such-sacct-on-path")
    with pytest.raises(SacctError, match="not on PATH"):
        reader.jobs([1])
    assert SacctReader.from_config(Config({"sacct": {"batch_size": 7}})).batch_size == 7
    with pytest.raises(ValueError):
        SacctReader(fmt="xml")
