"""The sacct reader on real output of Slurm 22.05.8, 24.11.5 and 26.05.5 (tests/data/sacct/<version>/README.md).

Every ``--json`` plugin each version has and its ``-P`` text must read into the same rows. The reader's
own path (json, exit codes from -P where the plugin's are wrong, -D runs) runs against ``replay-sacct``,
a stand-in that prints the captured output for the arguments it gets; no Slurm needed.
"""

from __future__ import annotations

import glob
import os
import stat
import sys

import pytest

from slurm_gpueff.slurm.commands import SlurmCommandError, job_ids
from slurm_gpueff.slurm.runner import SlurmRunner
from slurm_gpueff.slurm.sacct import (
    PARSABLE_FIELDS,
    SacctReader,
    exit_codes_wrong,
    number,
    parse_json,
    parse_parsable,
    plugin_name,
    raw_id_of,
)
from slurm_gpueff.slurm.sacct_rows import job_ids_of, last_runs, number_runs, parse_shards

DATA = os.path.join(os.path.dirname(__file__), "data", "sacct")
VERSIONS = ("22.05.8", "24.11.5", "26.05.5")
JSONS = [(v, os.path.basename(f)) for v in VERSIONS for f in sorted(glob.glob(os.path.join(DATA, v, "sacct*.json")))
         if "-D" not in f]
SAME = ("job_id_text", "array_job_id", "array_task_id", "het_job_id", "het_job_offset", "cluster", "user",
        "account", "partition", "qos", "job_name", "nodelist", "alloc_tres", "gpu_count", "gpu_type", "submit",
        "start", "end", "elapsed_s", "state", "exit_code", "signal")
# raw id -> (JobID, state, exit code, signal, GPUs): the same job set in every version (README)
EXPECTED = {1: ("1", "COMPLETED", 0, 0, 2), 9: ("2_0", "COMPLETED", 0, 0, 1), 10: ("2_1", "COMPLETED", 0, 0, 1),
            2: ("2_2", "COMPLETED", 0, 0, 1), 11: ("3_0", "COMPLETED", 0, 0, 1), 12: ("3_1", "COMPLETED", 0, 0, 1),
            13: ("3_2", "COMPLETED", 0, 0, 1), 3: ("3_3", "COMPLETED", 0, 0, 1), 4: ("4", "FAILED", 3, 0, 0),
            5: ("5", "FAILED", 0, 11, 0), 6: ("6+0", "COMPLETED", 0, 0, 1), 7: ("6+1", "COMPLETED", 0, 0, 1),
            8: ("8", "COMPLETED", 0, 0, 0), 14: ("14", "TIMEOUT", 0, 0, 0)}


def path(version: str, name: str) -> str:
    return os.path.join(DATA, version, name)


def read(version: str, name: str) -> str:
    with open(path(version, name)) as fh:
        return fh.read()


def by_id(jobs):
    return {j.job_id: j for j in jobs}


def parsable(version: str, runs: bool = False):
    return parse_parsable(read(version, "sacct-product-P-D.psv" if runs else "sacct-product-P.psv"))


@pytest.mark.parametrize("version, name", JSONS)
def test_every_plugin_reads_into_the_rows_of_sacct_P(version, name):
    jobs, meta = parse_json(read(version, name))
    plugin = plugin_name(meta)
    expected_plugin = "openapi/dbv0.0.38" if name == "sacct.json" else f"data_parser/{name[6:-5]}"
    assert plugin == expected_plugin and all(j.plugin == plugin for j in jobs)
    a, b = by_id(last_runs(jobs)), by_id(parsable(version))
    assert set(a) == set(b) == set(EXPECTED) and len(jobs) == (15 if version == "22.05.8" else 14)
    wrong = exit_codes_wrong(plugin)
    assert wrong == (version == "22.05.8")
    for raw, (text, state, code, sig, gpus) in EXPECTED.items():
        p = b[raw]
        assert (p.job_id_text, p.state, p.exit_code, p.signal, p.gpu_count) == (text, state, code, sig, gpus), raw
        for k in SAME:
            if wrong and k == "exit_code" and raw == 4:
                assert a[raw].exit_code == 0  # 22.05's JSON says 0 for `exit 3`: the reader asks -P (below)
                continue
            assert getattr(a[raw], k) == getattr(p, k), (raw, k)
    # only the meta record of the %2 array keeps the throttle, and only JSON has it
    assert [r for r, j in a.items() if j.array_throttle] == [3] and a[3].array_throttle == 2
    assert (a[6].nodes, a[7].nodes, a[6].het_job_id, a[7].het_job_offset) == (["vm"], ["vm-2"], 6, 1)
    assert a[14].end - a[14].start >= 64 and a[14].final  # TIMEOUT after --time=1
    assert (a[1].restart_count is None) == (name in ("sacct.json", "sacct.v0.0.40.json", "sacct.v0.0.41.json"))
    assert (a[1].sluid is not None) == (name == "sacct.v0.0.45.json")


@pytest.mark.parametrize("version", VERSIONS)
def test_requeued_job_has_two_runs_in_json_and_P(version):
    name = "sacct-D.json"
    json_runs = [j for j in number_runs(parse_json(read(version, name))[0]) if j.job_id == 8]
    p_runs = [j for j in number_runs(parsable(version, runs=True)) if j.job_id == 8]
    for runs in (json_runs, p_runs):
        runs.sort(key=lambda j: j.run)
        first, second = runs
        assert [j.run for j in runs] == [0, 1] and (first.state, second.state) == ("REQUEUED", "COMPLETED")
        assert first.run_over and not first.final and second.final  # the job went on; that run is over
        assert first.end <= second.start
    for x, y in zip(json_runs, p_runs, strict=True):
        for k in ("start", "end", "elapsed_s", "state", "exit_code", "signal", "gpu_count", "nodelist"):
            assert getattr(x, k) == getattr(y, k), (x.run, k)
    if version == "26.05.5":  # a new SLUID per run: (job id, sluid) names a run
        assert [j.sluid for j in json_runs] == ["s1P9M84NKN5600", "s1P9M84NMK2500"]
    if version != "22.05.8":  # restart_cnt from data_parser v0.0.42
        assert [j.restart_count for j in json_runs] == [0, 1]


REPLAY = r'''
import os, sys
args = sys.argv[1:]
data = os.environ["REPLAY_DIR"]
runs = "-D" in args
if "--json" in args:
    name = "sacct-D.json" if runs else os.environ.get("REPLAY_JSON", "sacct.json")
    sys.stdout.write(open(os.path.join(data, name)).read())
    sys.exit(0)
fields = args[args.index("-o") + 1].split(",")
if "Restarts" in fields:
    sys.stderr.write('sacct: fatal: Invalid field requested: "Restarts"\n')
    sys.exit(1)
delim = next((a.split("=", 1)[1] for a in args if a.startswith("--delimiter=")), "|")
product = os.environ["REPLAY_FIELDS"].split(",")
if not set(fields) <= set(product):
    sys.exit(0)  # the step query (sacct_steps.py): these captures have no step lines
text = open(os.path.join(data, "sacct-product-P-D.psv" if runs else "sacct-product-P.psv")).read()
spec = args[args.index("-j") + 1]
for line in text.splitlines():
    row = dict(zip(product, line.split("|")))
    if spec.isdigit() or spec in row["JobID"] or "," in spec:
        print(delim.join(row[f] for f in fields))
'''


@pytest.fixture
def replay(tmp_path, monkeypatch):
    """A ``sacct`` that prints a version's captured output (it rejects -P's Restarts, as 22.05 does)."""
    def use(version: str, json_name: str = "sacct.json") -> str:
        exe = tmp_path / "sacct"
        exe.write_text(f"#!{sys.executable}\n{REPLAY}")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
        monkeypatch.setenv("REPLAY_DIR", os.path.join(DATA, version))
        monkeypatch.setenv("REPLAY_JSON", json_name)
        monkeypatch.setenv("REPLAY_FIELDS", ",".join(PARSABLE_FIELDS))
        return str(exe)
    return use


def test_reader_takes_22_05_exit_codes_from_P(replay):
    reader = SacctReader(command=replay("22.05.8"))
    j = by_id(reader.jobs(EXPECTED))
    # --json, -P for the exit codes, -P for the CPU side (steps)
    assert reader.calls == 3 and set(j) == set(EXPECTED) and j[8].state == "COMPLETED"  # one record, the last run
    assert (j[4].exit_code, j[4].signal, j[5].exit_code, j[5].signal) == (3, 0, 0, 11)
    assert "openapi/dbv0.0.38" in j[4].notes[0]
    runs = [r for r in reader.jobs([8], runs=True) if r.job_id == 8]
    assert [(r.run, r.state, r.exit_code) for r in runs] == [(0, "REQUEUED", 0), (1, "COMPLETED", 0)]


@pytest.mark.parametrize("version, name", [("24.11.5", "sacct.v0.0.40.json"), ("26.05.5", "sacct.v0.0.45.json")])
def test_reader_trusts_later_json_and_numbers_runs(replay, version, name):
    reader = SacctReader(command=replay(version, name))
    j = by_id(reader.jobs(EXPECTED))
    assert reader.calls == 2 and (j[4].exit_code, j[5].signal) == (3, 11) and not j[4].notes  # --json, steps
    runs = reader.jobs([8], runs=True)
    assert [(r.job_id, r.run, r.state) for r in runs if r.job_id == 8] == [(8, 0, "REQUEUED"), (8, 1, "COMPLETED")]


def test_parsable_reader_on_22_05_drops_restarts_and_numbers_runs_by_start(replay):
    reader = SacctReader(command=replay("22.05.8"), fmt="parsable")
    runs = [r for r in reader.jobs([8], runs=True) if r.job_id == 8]
    assert not reader.restarts_field and reader.calls == 3  # the rejected Restarts field, without it, steps
    assert [(r.run, r.state, r.restart_count) for r in runs] == [(0, "REQUEUED", None), (1, "COMPLETED", None)]


def test_typed_ids_resolve_to_raw_ids(replay, monkeypatch):
    text = read("24.11.5", "sacct-product-P.psv")
    assert [raw_id_of(text, s) for s in ("2_0", "3_3", "6+1", "6+0", "14", "99_1")] == [9, 3, 7, 6, 14, None]
    sacct = replay("26.05.5")
    slurm = SlurmRunner(sacct)
    assert (job_ids(slurm, "2_1"), job_ids(slurm, "6+1"), job_ids(slurm, "99_1")) == ({10: "2_1"}, {7: "6+1"}, {})
    monkeypatch.setenv("PATH", "")  # no sacct beside the configured path nor on PATH
    with pytest.raises(SlurmCommandError, match="sacct not found"):
        job_ids(SlurmRunner("/nonexistent/sacct"), "2_1")


def test_an_array_or_het_id_lists_its_jobs_and_a_pending_record_is_none():
    text = read("24.11.5", "sacct-product-P.psv")
    lines = [ln for ln in text.splitlines() if ln.split("|")[1].startswith(("2_", "6+"))]
    assert job_ids_of("\n".join(lines)) == {9: "2_0", 10: "2_1", 2: "2_2", 6: "6+0", 7: "6+1"}
    assert job_ids_of("2|2_[0-2]|x\n11|3_0|y\n") == {11: "3_0"}


def test_number_unwraps_every_form():
    wrapped = [{"set": True, "infinite": False, "number": 5}, {"set": False, "infinite": False, "number": 0},
               {"set": True, "infinite": True, "number": 0}]
    assert [number(v) for v in (3, "4", None, True, *wrapped)] == [3, 4, None, None, 5, None, None]
    # 23.02 names its plugin under meta.plugins; slurmrestd without the "data_parser/" prefix
    assert plugin_name({"plugins": {"data_parser": "data_parser/v0.0.39"}}) == "data_parser/v0.0.39"
    assert exit_codes_wrong("data_parser/v0.0.39") and exit_codes_wrong("v0.0.39")
    assert not any(exit_codes_wrong(p) for p in ("data_parser/v0.0.40", "data_parser/v0.0.45", None, ""))


def test_public_23_02_capture():
    """Real sacct --json of Slurm 23.02.8 (tests/data/sacct/public/README.md): v0.0.39's mixed plain and
    wrapped integers, and the plugin name under meta.plugins that makes the reader ask -P for exit codes."""
    with open(os.path.join(DATA, "public", "sacct-23.02.8-v0.0.39.json")) as fh:
        jobs, meta = parse_json(fh.read())
    (j,) = jobs
    assert plugin_name(meta) == "data_parser/v0.0.39" and exit_codes_wrong(plugin_name(meta))
    assert (j.job_id, j.job_id_text, j.array_job_id, j.array_task_id, j.het_job_id) == (
        12079670, "12078642_6", 12078642, 6, None)
    assert (j.state, j.exit_code, j.signal, j.cluster, j.nodes, j.gpu_count) == (
        "COMPLETED", 0, 0, "alpine", ["c3cpu-a2-u1-1"], 0)
    assert (j.start, j.end, j.elapsed_s, j.submit) == (1741667820.0, 1741668146.0, 326.0, 1741662974.0)
    assert j.alloc_tres == "billing=9,cpu=10,mem=38400,node=1" and j.restart_count is None and j.sluid is None


def test_shards_in_alloc_tres():
    assert parse_shards("billing=1,cpu=1,gres/shard=3,node=1") == 3  # as 22.05 to 26.05 write it
    assert parse_shards("cpu=1,gres/shard:h100=2,gres/shard:a100=1") == 3
    assert parse_shards("cpu=1,gres/gpu=1,gres/gpu:simh100=1") is None and parse_shards(None) is None
