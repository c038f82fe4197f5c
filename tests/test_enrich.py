"""Enrichment and backfill on the storage side, fed with sacct output captured from a real Slurm 22.05.

``Replay`` serves the parsed captured output (tests/data/sacct/) through the reader interface; the
real sacct runs in tests/slurm/ (marker ``slurm``). Database, ingest and lookups are the real code.
"""

from __future__ import annotations

import os
import time

import pytest
from sqlmodel import Session, select

from slurm_gpueff import record as recmod
from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.slurm.jobid import parse as parse_id
from slurm_gpueff.slurm.sacct import SacctError, parse_json, parse_parsable
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.enrich import backfill_jobs, enrich_jobs
from slurm_gpueff.storage.queries import find_jobs
from slurm_gpueff.storage.writer import ingest_record

DATA = os.path.join(os.path.dirname(__file__), "data", "sacct")


def captured(fmt: str = "json"):
    with open(os.path.join(DATA, f"sacct-22.05-{'json.json' if fmt == 'json' else 'parsable.txt'}")) as fh:
        text = fh.read()
    return parse_json(text)[0] if fmt == "json" else parse_parsable(text, delimiter="|")


class Replay:
    """The reader interface over captured output; ``fail`` makes it raise like an unreachable sacct."""

    batch_size = 2

    def __init__(self, jobs, fail: str | None = None):
        self.by_id = {j.job_id: j for j in jobs}
        self.fail = fail
        self.calls = 0

    def jobs(self, ids, cluster=None, runs=False):
        self.calls += 1
        if self.fail:
            raise SacctError(self.fail)
        return [self.by_id[i] for i in ids if i in self.by_id]


def hook_record(job_id: int, gpus: list[int], exit_code: int = 0, user: str = "alice") -> dict:
    """What the Epilog writes (slurmd hooks: raw id only, no array/het ids)."""
    return {"schema": recmod.SCHEMA_VERSION, "cluster": "gpueffci", "node": "vm", "job_id": job_id,
            "array_job_id": None, "array_task_id": None, "het_job_id": None, "het_job_offset": None,
            "user": user, "uid": 1001, "account": "research", "partition": "debug",
            "start_time": 1795357228.0, "end_time": 1795357230.0, "exit_code": exit_code, "signal": 0,
            "backend": "simulated", "reason": None,
            "gpus": [recmod.empty_gpu(i, "simulated", "test") for i in gpus], "written_at": time.time(),
            "writer": "test"}


@pytest.fixture
def engine(tmp_path):
    e = make_engine(f"sqlite:///{tmp_path / 'gpueff.db'}")
    yield e
    e.dispose()


def store(engine, *recs):
    with Session(engine) as s:
        for r in recs:
            ingest_record(s, r)
        s.commit()


def job(engine, job_id: int) -> Job:
    with Session(engine) as s:
        return s.exec(select(Job).where(Job.job_id == job_id)).one()


def test_enrich_fills_array_ids_state_and_name_in_batches(engine):
    store(engine, hook_record(19, [0]), hook_record(15, [1]), hook_record(14, [2], exit_code=3),
          hook_record(12, [0, 1], user="root"))
    reader = Replay(captured("parsable"))
    res = enrich_jobs(engine, reader)
    assert (res.checked, res.enriched, res.not_found, res.errors) == (4, 4, 0, [])
    assert reader.calls == 2  # 4 jobs in batches of 2
    t0 = job(engine, 19)
    assert (t0.array_job_id, t0.array_task_id, t0.job_name, t0.qos, t0.enriched) == (15, 0, "arr", "normal", True)
    # accounting's elapsed time replaces the hook's 2 s
    assert t0.submit_time is not None and t0.elapsed_s == 1.0 and t0.state == "COMPLETED"
    assert (job(engine, 14).state, job(engine, 14).exit_code) == ("FAILED", 3)
    with Session(engine) as s:  # seff-gpu 15_0 and the raw id both find the task; 15 finds the array
        assert [j.job_id for j in find_jobs(s, parse_id("15_0"))] == [19]
        assert [j.job_id for j in find_jobs(s, parse_id("19"))] == [19]
        assert sorted(j.job_id for j in find_jobs(s, parse_id("15"))) == [15, 19]
    # ingest after enrichment keeps what accounting said
    store(engine, hook_record(19, [0]))
    assert job(engine, 19).array_task_id == 0 and job(engine, 19).enriched
    assert enrich_jobs(engine, reader).checked == 0


def test_het_component_found_by_plus_id(engine):
    store(engine, hook_record(17, [1], user="root"))
    res = enrich_jobs(engine, Replay(captured("json")))  # json: het 16+1 cancelled (final)
    assert res.enriched == 1
    with Session(engine) as s:
        assert [j.job_id for j in find_jobs(s, parse_id("16+1"))] == [17]


def test_unfinished_unknown_and_unreachable_are_retried(engine):
    store(engine, hook_record(16, [0]), hook_record(999, [0]), hook_record(11, [0]))
    res = enrich_jobs(engine, Replay(captured("parsable")))  # 16 PENDING there, 999 unknown
    assert (res.enriched, res.not_final, res.not_found) == (1, 1, 1)
    assert not job(engine, 16).enriched and not job(engine, 999).enriched
    res = enrich_jobs(engine, Replay([], fail="sacct did not answer within 2 s"))
    assert res.errors == ["sacct did not answer within 2 s"] and res.enriched == 0
    assert not job(engine, 16).enriched


def test_backfill_creates_allocation_only_records_and_the_hook_record_replaces_them(engine):
    store(engine, hook_record(11, [0]))
    res = backfill_jobs(engine, captured("parsable"), default_cluster="gpueffci")
    # GPU jobs without a record: 12, 14, 15_0 (19), 15_1 (15); 11 had one; 13 CPU, 18 never ran, 16/17 pending
    assert sorted(res.created_ids) == ["12", "14", "15_0", "15_1"]
    assert (res.had_record, res.enriched, res.no_gpus, res.not_final) == (1, 1, 4, 0)
    b = job(engine, 12)
    assert (b.record_source, b.gpu_count, b.user, b.state, b.enriched, b.backend) == (
        "backfill", 2, "root", "COMPLETED", True, "none")
    assert "no GPU record from the Slurm hooks" in b.reason
    with Session(engine) as s:
        rows = s.exec(select(JobGpu).where(JobGpu.job_pk == b.id)).all()
        assert len(rows) == 2 and all(r.kernel_active is None and r.missing["kernel_active"] for r in rows)
    assert job(engine, 14).exit_code == 3
    again = backfill_jobs(engine, captured("parsable"), default_cluster="gpueffci")
    assert again.created == 0 and again.had_record == 5
    store(engine, hook_record(12, [2, 3], user="root"))  # the hook's record turns up after all
    h = job(engine, 12)
    assert (h.record_source, h.reason, h.backend, h.gpu_count, h.enriched) == ("hook", None, "simulated", 2, True)
    with Session(engine) as s:
        assert sorted(r.gpu_index for r in s.exec(select(JobGpu).where(JobGpu.job_pk == h.id))) == [2, 3]


class J:
    def __init__(self, user, uid):
        self.user, self.uid = user, uid


def test_a_just_finished_job_waits_for_accounting_to_settle(engine):
    """slurmdbd (22.05, seen in tests/slurm) reports a finished array task as a plain job ("5|5|COMPLETED")
    for a few seconds before its array ids arrive. Enrichment is written once, so a job that ended less
    than settle_s ago is left for the next run, and then gets the settled record's array ids."""
    import dataclasses

    settled = {j.job_id: j for j in captured("parsable")}[19]
    early = dataclasses.replace(settled, array_job_id=None, array_task_id=None, job_id_text="19", notes=[])
    store(engine, hook_record(19, [0]))
    res = enrich_jobs(engine, Replay([early]), settle_s=120, now=settled.end + 3)
    assert (res.checked, res.enriched, res.settling) == (1, 0, 1)
    assert not job(engine, 19).enriched and job(engine, 19).array_job_id is None
    res = enrich_jobs(engine, Replay([settled]), settle_s=120, now=settled.end + 121)
    assert (res.checked, res.enriched, res.settling) == (1, 1, 0)
    t0 = job(engine, 19)
    assert (t0.array_job_id, t0.array_task_id, t0.enriched) == (15, 0, True)


def test_a_run_asked_to_stop_ends_at_its_next_batch_and_keeps_what_it_committed(engine):
    """The service's stop (SIGTERM) sets what ``stop`` asks: a run through a large backlog (many sacct calls)
    ends before its next call instead of holding the stop; its committed batches stay, and the next run
    takes the rest."""
    store(engine, hook_record(19, [0]), hook_record(15, [1]), hook_record(14, [2], exit_code=3),
          hook_record(12, [0, 1], user="root"))
    reader = Replay(captured("parsable"))
    res = enrich_jobs(engine, reader, stop=lambda: reader.calls >= 1)
    assert (res.stopped, reader.calls, res.checked, res.enriched, res.errors) == (True, 1, 2, 2, [])
    rest = enrich_jobs(engine, reader)
    assert (rest.stopped, rest.checked, rest.enriched) == (False, 2, 2)
    assert all(job(engine, j).enriched for j in (19, 15, 14, 12))


def test_a_run_makes_way_before_each_batch_after_the_first(engine):
    """The service hands enrich its ``make_way`` (the nodes' pushes and users' questions first): 4 jobs in
    batches of 2 are 2 sacct calls, and make_way is asked once, after the first batch was committed."""
    store(engine, hook_record(19, [0]), hook_record(15, [1]), hook_record(14, [2], exit_code=3),
          hook_record(12, [0, 1], user="root"))
    reader = Replay(captured("parsable"))
    seen: list[tuple[int, int]] = []

    def between() -> None:
        with Session(engine) as s:
            seen.append((reader.calls, len(s.exec(select(Job).where(Job.enriched)).all())))

    res = enrich_jobs(engine, reader, between=between)
    assert (res.enriched, reader.calls, seen) == (4, 2, [(1, 2)])
