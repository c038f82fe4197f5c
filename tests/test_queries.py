"""Job lookup by the ids users type, on a real SQLite database built with the real models."""

from __future__ import annotations

import pytest
from sqlmodel import Session

from slurm_gpueff.models import Job, JobGpu, JobGpuTimeline
from slurm_gpueff.slurm.jobid import parse
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.queries import find_jobs, gpu_timelines, job_gpus


@pytest.fixture
def session(tmp_path):
    engine = make_engine(str(tmp_path / "q.db"))
    rows = [
        Job(cluster="a", job_id=100),                                        # plain job
        Job(cluster="b", job_id=100),                                        # same id, other cluster
        # array 200: Slurm gives the array's own id (200) to one of its tasks (here task 3)
        Job(cluster="a", job_id=200, array_job_id=200, array_task_id=3),
        Job(cluster="a", job_id=201, array_job_id=200, array_task_id=1),
        Job(cluster="a", job_id=202, array_job_id=200, array_task_id=2),
        # array 300 whose task with raw id 300 was never recorded
        Job(cluster="a", job_id=301, array_job_id=300, array_task_id=0),
        Job(cluster="a", job_id=302, array_job_id=300, array_task_id=1),
        # het job 400 (leader raw id 400, offset 0; component 1 raw id 401)
        Job(cluster="a", job_id=400, het_job_id=400, het_job_offset=0),
        Job(cluster="a", job_id=401, het_job_id=400, het_job_offset=1),
        # a task row lacking its array id: found by raw id + task
        Job(cluster="a", job_id=500, array_task_id=7),
    ]
    with Session(engine) as s:
        for r in rows:
            s.add(r)
        s.commit()
        yield s
    engine.dispose()


def ids(jobs):
    return [(j.cluster, j.job_id) for j in jobs]


def test_plain_id(session):
    assert ids(find_jobs(session, parse("100"), cluster="a")) == [("a", 100)]
    assert ids(find_jobs(session, parse("100"))) == [("a", 100), ("b", 100)]
    assert find_jobs(session, parse("999")) == []


def test_array_id_means_every_task(session):
    assert ids(find_jobs(session, parse("200"))) == [("a", 201), ("a", 202), ("a", 200)]  # by task
    assert ids(find_jobs(session, parse("300"))) == [("a", 301), ("a", 302)]  # no raw 300 row


def test_raw_id_of_a_task_is_that_task(session):
    assert ids(find_jobs(session, parse("202"))) == [("a", 202)]


def test_array_task(session):
    assert ids(find_jobs(session, parse("200_2"))) == [("a", 202)]
    assert ids(find_jobs(session, parse("200_3"))) == [("a", 200)]
    assert ids(find_jobs(session, parse("500_7"))) == [("a", 500)]
    assert find_jobs(session, parse("200_9")) == []
    assert find_jobs(session, parse("100_0")) == []


def test_het_job(session):
    assert ids(find_jobs(session, parse("400"))) == [("a", 400), ("a", 401)]
    assert ids(find_jobs(session, parse("400+1"))) == [("a", 401)]
    assert ids(find_jobs(session, parse("400+0"))) == [("a", 400)]
    assert find_jobs(session, parse("400+2")) == []
    assert ids(find_jobs(session, parse("401"))) == [("a", 401)]


def test_cluster_filter_applies_to_groups(session):
    assert find_jobs(session, parse("200"), cluster="b") == []


def test_gpus_and_timelines(session):
    job = find_jobs(session, parse("100"), cluster="a")[0]
    for node, idx in (("n2", 0), ("n1", 1), ("n1", 0)):
        session.add(JobGpu(job_pk=job.id, node=node, gpu_index=idx))
    session.commit()
    gpus = job_gpus(session, job)
    assert [(g.node, g.gpu_index) for g in gpus] == [("n1", 0), ("n1", 1), ("n2", 0)]
    session.add(JobGpuTimeline(job_gpu_id=gpus[0].id, points=[[30.0, 0.9, 0.5, 0.4]]))
    session.commit()
    assert gpu_timelines(session, gpus) == {gpus[0].id: [[30.0, 0.9, 0.5, 0.4]]}
    assert gpu_timelines(session, []) == {}
