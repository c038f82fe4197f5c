"""A running job's saved state (slurm_gpueff/jobstate.py): the one place that writes, reads and lists the
Prolog's ``<state_dir>/jobs/<id>.json``, as the Epilog, the agent, live records and seff-gpu use it."""

from __future__ import annotations

import os

from slurm_gpueff import jobstate, statedir


def test_save_load_round_trip_private(tmp_path):
    path = statedir.job(str(tmp_path), 42)
    assert path == os.path.join(str(tmp_path), "jobs", "42.json")
    jobstate.save(path, {"start": {"uuids": ["GPU-a"]}, "start_time": 1.7e9, "gpus": [0, 1], "reason": None})
    saved, problem = jobstate.load(path)
    assert problem is None and saved is not None and saved["gpus"] == [0, 1]
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    assert jobstate.exists(str(tmp_path), 42) and not jobstate.exists(str(tmp_path), 43)


def test_missing_damaged_and_startless_states_say_why(tmp_path):
    d = str(tmp_path)
    assert jobstate.load(statedir.job(d, 1)) == (None, jobstate.NO_STATE)
    os.makedirs(statedir.jobs(d))
    with open(statedir.job(d, 2), "w") as fh:
        fh.write("{not json")
    saved, problem = jobstate.load(statedir.job(d, 2))
    assert saved is None and problem is not None and "unreadable" in problem
    with open(statedir.job(d, 3), "w") as fh:
        fh.write('{"start_time": true, "gpus": [0]}')
    saved, problem = jobstate.load(statedir.job(d, 3))
    assert saved is not None and saved["start_time"] is None and "no valid start time" in (problem or "")


def test_running_jobs_are_the_state_files_by_job_id(tmp_path):
    d = str(tmp_path)
    assert jobstate.running(d) == []  # no folder yet
    for job in (10, 9, 100):
        jobstate.save(statedir.job(d, job), {"start_time": 1.0})
    for stray in (".tmp-9.json", "abc.json", "7.json.tmp", "\u00b2.json"):
        with open(os.path.join(statedir.jobs(d), stray), "w") as fh:
            fh.write("{}")
    assert [os.path.basename(p) for p in jobstate.running(d)] == ["9.json", "10.json", "100.json"]
    assert sorted(e.name for e in jobstate.entries(d)) == ["10.json", "100.json", "9.json"]


def test_saved_gpus_and_uuids_take_only_what_is_well_formed():
    assert jobstate.saved_gpus({"gpus": [0, 2, -1, True, "3", 1.0]}) == [0, 2]
    assert jobstate.saved_gpus({"gpus": "0"}) == []
    saved = {"start": {"uuids": ["GPU-a", "MIG-b", "GPU-a", "junk", 7]}}
    assert jobstate.saved_uuids(saved) == ["GPU-a", "MIG-b"]
    assert jobstate.saved_uuids([]) == [] and jobstate.saved_uuids({"start": None}) == []


def test_an_unstorable_start_state_is_dropped_with_the_reason(tmp_path):
    path = statedir.job(str(tmp_path), 5)
    jobstate.save(path, {"start": {"sm": float("nan")}, "start_time": 1.7e9, "reason": "earlier"})
    saved, problem = jobstate.load(path)
    assert problem is None and saved is not None and saved["start"] is None
    assert saved["reason"].startswith("earlier; collector start state not storable")
