"""The stored job summary equals the analysis, and is recomputed when a job's data changes."""

from __future__ import annotations

from sites import sim_record, spool_records
from sqlmodel import Session, select

from slurm_gpueff.analysis.diagnose import assess
from slurm_gpueff.analysis.figures import job_figures
from slurm_gpueff.collectors.simulated import PROFILES
from slurm_gpueff.models import Job, JobGpu
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool


def spool_job(spool_dir: str, job_id: int, profile: str, gpus: int, node: str = "n1") -> None:
    spool_records(spool_dir, [sim_record(job_id, profile, gpus, 2.0, start=1.7e9, cluster="c", node=node, user="u")])


def test_summary_matches_analysis_for_every_profile(tmp_path):
    engine = make_engine(str(tmp_path / "db.sqlite"))
    for n, profile in enumerate(PROFILES):
        spool_job(str(tmp_path / "spool"), 100 + n, profile, 4 if profile == "one-of-n-gpus" else 1)
    ingest_spool(engine, str(tmp_path / "spool"))
    assert summarize_pending(engine) == len(PROFILES)
    assert summarize_pending(engine) == 0  # nothing stale left
    with Session(engine) as s:
        for job in s.exec(select(Job)).all():
            gpus = s.exec(select(JobGpu).where(JobGpu.job_pk == job.id)).all()
            fig = job_figures(job, gpus)
            diag = assess(fig)
            assert (job.verdict, job.verdict_title) == (diag.primary.name, diag.primary.title)
            assert abs(job.gpu_hours - fig.hours) < 1e-9
            parts = job.idle_gpu_hours + job.underfilled_gpu_hours + job.sm_active_gpu_hours
            assert abs(parts - job.gpu_hours) < 1e-9
            expected_t = sum(g.hours * g.mean("tensor_active") for g in fig.gpus)
            assert abs(job.tensor_active_gpu_hours - expected_t) < 1e-9
            assert job.analyzed_at is not None


def test_a_job_whose_gpus_differ_stores_each_verdicts_gpus(tmp_path):
    """A verdict concerns GPUs: "3 of 4 GPUs never used" is not the fourth GPU's, which worked. The summary
    keeps each first verdict's GPUs, GPU-hours and lost hours ("" for the GPU no verdict concerns), adding up
    to the job's; a job whose GPUs all share its verdict (every one-GPU job) stores none."""
    engine = make_engine(str(tmp_path / "db.sqlite"))
    spool_job(str(tmp_path / "spool"), 1, "one-of-n-gpus", 4)
    spool_job(str(tmp_path / "spool"), 2, "bf16-healthy", 2)
    spool_job(str(tmp_path / "spool"), 3, "idle", 1)
    ingest_spool(engine, str(tmp_path / "spool"))
    summarize_pending(engine)
    with Session(engine) as s:
        jobs = {j.job_id: j for j in s.exec(select(Job)).all()}
    split = jobs[1].gpu_verdicts
    assert split is not None and set(split) == {"never_used", ""}, split
    assert split["never_used"][:2] == [3, 6.0] and abs(split["never_used"][2] - 6.0) < 1e-9  # idle all along
    assert split[""][:2] == [1, 2.0] and 0 < split[""][2] < 1.0  # the GPU that worked lost little
    assert sum(p[0] for p in split.values()) == jobs[1].gpu_count
    assert abs(sum(p[1] for p in split.values()) - jobs[1].gpu_hours) < 1e-9
    lost = jobs[1].idle_gpu_hours + jobs[1].underfilled_gpu_hours
    assert abs(sum(p[2] for p in split.values()) - lost) < 1e-9
    assert jobs[2].gpu_verdicts is None and jobs[3].gpu_verdicts is None
    with make_engine(str(tmp_path / "db.sqlite")).connect() as conn:  # SQL NULL, not JSON null: queries test IS NULL
        from sqlalchemy import text

        assert conn.execute(text("SELECT job_id FROM job WHERE gpu_verdicts IS NULL ORDER BY job_id")).scalars().all() \
            == [2, 3]


def test_reingest_of_another_node_marks_job_stale(tmp_path):
    engine = make_engine(str(tmp_path / "db.sqlite"))
    spool_job(str(tmp_path / "spool"), 7, "bf16-healthy", 1, node="n1")
    ingest_spool(engine, str(tmp_path / "spool"))
    summarize_pending(engine)
    spool_job(str(tmp_path / "spool"), 7, "idle", 1, node="n2")  # second node of the same job
    ingest_spool(engine, str(tmp_path / "spool"))
    assert summarize_pending(engine) == 1
    with Session(engine) as s:
        job = s.exec(select(Job)).one()
        assert job.gpu_count == 2
        assert job.verdict == "never_used"  # the idle second node is now part of the job
        assert abs(job.gpu_hours - 4.0) < 1e-9


def test_summarizing_makes_way_between_its_batches(tmp_path, monkeypatch):
    """The service hands summarize_pending the API's make_way, called before each batch after the first: 5
    jobs in batches of 2 are 3 batches, so 2 calls, each after a batch was committed (its jobs analysed)."""
    from slurm_gpueff.service import summarize

    monkeypatch.setattr(summarize, "BATCH", 2)
    engine = make_engine(str(tmp_path / "db.sqlite"))
    for n in range(5):
        spool_job(str(tmp_path / "spool"), 200 + n, "bf16-healthy", 1)
    ingest_spool(engine, str(tmp_path / "spool"))

    def analysed() -> int:
        with Session(engine) as s:
            return len([j for j in s.exec(select(Job)).all() if j.analyzed_at is not None])

    seen: list[int] = []
    assert summarize_pending(engine, between=lambda: seen.append(analysed())) == 5
    assert seen == [2, 4] and analysed() == 5


def test_summarizing_asked_to_stop_ends_after_the_batch_it_committed(tmp_path, monkeypatch):
    """The stopping service's ``stop``: 5 jobs in batches of 2, asked to stop once a batch is in: 2 jobs
    analysed, the other 3 by the next run."""
    from slurm_gpueff.service import summarize

    monkeypatch.setattr(summarize, "BATCH", 2)
    engine = make_engine(str(tmp_path / "db.sqlite"))
    for n in range(5):
        spool_job(str(tmp_path / "spool"), 200 + n, "bf16-healthy", 1)
    ingest_spool(engine, str(tmp_path / "spool"))
    assert summarize_pending(engine, stop=lambda: True) == 2
    assert summarize_pending(engine) == 3
