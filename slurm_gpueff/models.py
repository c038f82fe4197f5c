"""The data model (SQLModel tables); natural keys, NULL semantics and the data flow: docs/DESIGN.md.

Explicit table names and a constraint naming convention, because Alembic needs stable names. ``job.job_id``
is Slurm's raw id (JobIDRaw); the array/het ids are extra columns so ``123_4`` and ``123+1`` resolve.
"""

from __future__ import annotations

from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Date,
    DateTime,
    Index,
    MetaData,
    UniqueConstraint,
    case,
    exists,
    literal_column,
    select,
    text,
    tuple_,
)
from sqlmodel import Field, SQLModel

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}
SQLModel.metadata = MetaData(naming_convention=NAMING_CONVENTION)

# Naive UTC on every backend. Spelled out because newer SQLModel maps ``datetime`` to a tz-aware type
# that behaves differently on SQLite (naive) and PostgreSQL (timestamptz).
UTC_NAIVE = DateTime(timezone=False)
# A running job's row (its live records so far), written as a literal: a partial index is used only for a
# query whose WHERE has its very predicate, which a bound parameter is not (SQLite, PostgreSQL generic plans).
LIVE = text("record_source = 'live'")
# Its complement: the rows of the indexes on columns that a running job's updates move (its figures' time,
# its analysis time). Kept out of those indexes, a live update adds no entry there; see migration 0017.
NOT_LIVE = text("record_source <> 'live'")


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


class Job(SQLModel, table=True):
    """One run of a Slurm job that had (or should have had) GPUs: a requeued job has a row per run.

    ``run`` is the run's restart count (0: the first run); a negative ``run`` is a run the Epilog could not
    settle without its Prolog's state, until enrichment settles it (docs/DESIGN.md, "Runs").
    """

    __tablename__ = "job"
    __table_args__ = (UniqueConstraint("cluster", "job_id", "run", name="uq_job_cluster_job_id_run"),
                      Index("ix_job_rerun", "cluster", "job_id", postgresql_where=text("run <> 0"),
                            sqlite_where=text("run <> 0")),
                      # the running jobs' rows, for the idle-GPU pass (LIVE: its predicate, as the queries write it)
                      Index("ix_job_live", "id", postgresql_where=LIVE, sqlite_where=LIVE),
                      # the jobs waiting for their analysis, oldest first (summarize's batches; migration 0016)
                      Index("ix_job_pending", "id", postgresql_where=text("analyzed_at IS NULL"),
                            sqlite_where=text("analyzed_at IS NULL")),
                      # a user's or an account's jobs are read by when they ended (tables, monthly summaries);
                      # these and the two below hold finished jobs only (NOT_LIVE; migration 0017)
                      Index("ix_job_user_end", "user", "end_time", postgresql_where=NOT_LIVE,
                            sqlite_where=NOT_LIVE),
                      Index("ix_job_account_end", "account", "end_time", postgresql_where=NOT_LIVE,
                            sqlite_where=NOT_LIVE),
                      Index("ix_job_end_time", "end_time", postgresql_where=NOT_LIVE, sqlite_where=NOT_LIVE),
                      Index("ix_job_analyzed_at", "analyzed_at", postgresql_where=NOT_LIVE,
                            sqlite_where=NOT_LIVE))

    id: int | None = Field(default=None, primary_key=True)
    cluster: str = Field(max_length=64)
    job_id: int = Field(sa_type=BigInteger, index=True)
    run: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    sluid: str | None = Field(default=None, max_length=32)
    array_job_id: int | None = Field(default=None, sa_type=BigInteger, index=True)
    array_task_id: int | None = Field(default=None, sa_type=BigInteger)
    het_job_id: int | None = Field(default=None, sa_type=BigInteger, index=True)
    het_job_offset: int | None = Field(default=None)
    job_name: str | None = Field(default=None, max_length=512)
    user: str | None = Field(default=None, max_length=128)
    uid: int | None = Field(default=None, sa_type=BigInteger)
    account: str | None = Field(default=None, max_length=128)
    partition: str | None = Field(default=None, max_length=128)
    qos: str | None = Field(default=None, max_length=128)
    nodelist: str | None = Field(default=None, max_length=1024)
    gpu_count: int = 0
    gpu_type: str | None = Field(default=None, max_length=128)
    submit_time: datetime | None = Field(default=None, sa_type=UTC_NAIVE)
    start_time: datetime | None = Field(default=None, sa_type=UTC_NAIVE)  # no index: no query selects by it
    end_time: datetime | None = Field(default=None, sa_type=UTC_NAIVE)  # indexed for finished jobs (above)
    elapsed_s: float | None = None
    # The CPU side, from Slurm accounting (NULL: not reported): allocated CPUs, TotalCPU (user + system
    # seconds of all steps) and the largest MaxRSS of any step.
    alloc_cpus: int | None = None
    total_cpu_s: float | None = None
    max_rss_bytes: int | None = Field(default=None, sa_type=BigInteger)
    state: str | None = Field(default=None, max_length=32)
    exit_code: int | None = None
    signal: int | None = None
    backend: str = Field(default="none", max_length=16)
    reason: str | None = Field(default=None, max_length=1024)
    record_source: str = Field(default="hook", max_length=16)
    enriched: bool = False
    ingested_at: datetime | None = Field(default=None, sa_type=UTC_NAIVE)
    # The job's summary, written by slurm_gpueff.service.summarize, so rollups, reports and Prometheus aggregate
    # in SQL. analyzed_at NULL = needs (re)analysis (ingest and enrichment reset it); NULL parts: unknown.
    gpu_hours: float | None = None
    idle_gpu_hours: float | None = None
    underfilled_gpu_hours: float | None = None
    sm_active_gpu_hours: float | None = None
    tensor_active_gpu_hours: float | None = None
    kernel_active: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    energy_j: float | None = None
    verdict: str | None = Field(default=None, max_length=32)  # no index: filtered beside a time range
    verdict_title: str | None = Field(default=None, max_length=128)
    # A verdict concerns GPUs (analysis.diagnose.gpu_split): where the job's GPUs do not all have its primary
    # verdict first ("3 of 4 GPUs never used", the fourth working), each first verdict ("" for none) ->
    # [GPUs, GPU-hours, GPU-hours lost]; NULL where they all do, its own figures then being its verdict's.
    gpu_verdicts: dict[str, list[float]] | None = Field(default=None, sa_column=Column(JSON(none_as_null=True)))
    analyzed_at: datetime | None = Field(default=None, sa_type=UTC_NAIVE)  # indexed for finished jobs (above)


def not_live(table: Any = None) -> Any:
    """SQL: a job row that is no running job's (:data:`NOT_LIVE`, of ``table``: another name of the job
    table, when given): what the reports and rollups sum and enrichment may settle. The value is a literal, as
    in the predicate of the finished jobs' indexes, so that the planner can use them."""
    c = (table if table is not None else Job.metadata.tables["job"]).c
    return c.record_source != literal_column("'live'")


def live(table: Any = None) -> Any:
    """SQL: a running job's row (:data:`LIVE`, of ``table`` when given), the rows of ``ix_job_live``."""
    c = (table if table is not None else Job.metadata.tables["job"]).c
    return c.record_source == literal_column("'live'")


def ran_more_than_once(row: Any = None) -> Any:
    """SQL: whether the job row's job has a run other than 0, i.e. more than one run (runs are unique). The
    few such jobs (the partial index ix_job_rerun) are read once into a hash; a look for another run of
    the same job, once per job row, was most of a month's rollup, so callers put it under this, CASE in
    CASE, in that order. ``row``: the columns (``cluster``, ``job_id``) of the rows asked about, when not
    the job table's own (a subquery of its rows)."""
    j = Job.metadata.tables["job"]
    c = row if row is not None else j.c
    rerun = j.alias("rerun")
    return tuple_(c.cluster, c.job_id).in_(select(rerun.c.cluster, rerun.c.job_id).where(rerun.c.run != 0))


def last_run_count() -> Any:
    """SQL: 1 for a job row no later run of its job follows, else 0; summed, it counts a requeued job once
    (as its last run) while the GPU-hours of all its runs are summed."""
    j = Job.metadata.tables["job"]
    later = j.alias("later_run")
    followed = exists().where(later.c.cluster == j.c.cluster, later.c.job_id == j.c.job_id, later.c.run > j.c.run)
    return case((ran_more_than_once(), case((followed, 0), else_=1)), else_=1)


class JobGpu(SQLModel, table=True):
    """One GPU of one job on one node, with its figures over the job's window on that GPU."""

    __tablename__ = "job_gpu"
    # fillfactor: room in each page for its live updates, which change no indexed column and so are HOT
    __table_args__ = (UniqueConstraint("job_pk", "node", "gpu_index", name="uq_job_gpu_job_node_index"),
                      {"postgresql_with": {"fillfactor": 80}})

    id: int | None = Field(default=None, primary_key=True)
    # No index of its own: the unique (job_pk, node, gpu_index) index serves lookups by job (migration 0003).
    job_pk: int = Field(foreign_key="job.id", ondelete="CASCADE")
    node: str = Field(max_length=128)
    gpu_index: int
    minor: int | None = None
    uuid: str | None = Field(default=None, max_length=96)
    pci_bus_id: str | None = Field(default=None, max_length=32)
    model: str | None = Field(default=None, max_length=128)
    memory_total_bytes: int | None = Field(default=None, sa_type=BigInteger)
    start_time: datetime | None = Field(default=None, sa_type=UTC_NAIVE)
    end_time: datetime | None = Field(default=None, sa_type=UTC_NAIVE)
    kernel_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    hmma_active: float | None = None  # tensor activity by precision: FP16/BF16/TF32, integer, FP64
    imma_active: float | None = None
    dfma_active: float | None = None
    memory_used_peak_bytes: int | None = Field(default=None, sa_type=BigInteger)
    energy_j: float | None = None
    power_mean_w: float | None = None
    source: str = Field(default="none", max_length=16)
    samples: int = 0
    missing: dict[str, str] | None = Field(default=None, sa_column=Column(JSON))
    # DCGM job statistics (NULL on other backends): XID errors, seconds of clock throttling per cause,
    # compute PIDs. MIG: the slice the job held (uuid is then the parent GPU's).
    xid_errors: int | None = None
    throttle_s: dict[str, float] | None = Field(default=None, sa_column=Column(JSON))
    processes: list[int] | None = Field(default=None, sa_column=Column(JSON))
    mig_uuid: str | None = Field(default=None, max_length=96)
    mig_profile: str | None = Field(default=None, max_length=32)
    mig_gi_id: int | None = None
    mig_ci_id: int | None = None
    # The window the figures cover (record.py: window_s, measured_s, window).
    window_s: float | None = None
    measured_s: float | None = None
    window: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # A shared GPU (Slurm gres/shard): the shards the job held and how many the GPU has, from accounting
    # and the node's configuration (storage/enrich.py); NULL for a GPU held whole.
    shards: int | None = None
    shard_count: int | None = None
    # Shared with other jobs while it ran (record.py ``shared``): with whom, how the job's own part of the
    # figures above was measured, its time-weighted share; NULL for a GPU the job held alone.
    shared: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))


class JobGpuTimeline(SQLModel, table=True):
    """Coarse timeline of one job GPU, kept apart so retention can drop it without touching figures."""

    __tablename__ = "job_gpu_timeline"

    job_gpu_id: int = Field(foreign_key="job_gpu.id", primary_key=True, ondelete="CASCADE")
    points: list[list[float | None]] = Field(default_factory=list, sa_column=Column(JSON))


class ReportLog(SQLModel, table=True):
    """The reports' sent-log: one row per message (a job's card, a monthly summary), so none goes twice.

    ``subject`` is the message's natural key (``card``: ``<cluster>:<raw job id>``; ``monthly``:
    ``<YYYY-MM>:<account or *>``), unique per ``kind`` and ``dry_run``: a dry run never blocks a real
    send. The row is claimed (status ``sending``) and committed *before* the SMTP conversation, so two
    runners cannot both send. ``failed`` rows are retried from the archived ``.eml`` after
    ``next_try_at``; ``skipped`` rows say why no card went (opt-out, rate limit, no address).
    """

    __tablename__ = "report_log"
    __table_args__ = (UniqueConstraint("kind", "subject", "dry_run", name="uq_report_log_kind_subject_dry_run"),)

    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=16)
    subject: str = Field(max_length=256)
    dry_run: bool = False
    job_pk: int | None = Field(default=None, index=True)
    user: str | None = Field(default=None, max_length=128, index=True)
    recipients: str = Field(default="", max_length=2048)
    status: str = Field(default="sending", max_length=16, index=True)
    reason: str | None = Field(default=None, max_length=1024)
    attempts: int = 0
    created_at: datetime = Field(sa_type=UTC_NAIVE, index=True)
    sent_at: datetime | None = Field(default=None, sa_type=UTC_NAIVE)
    next_try_at: datetime | None = Field(default=None, sa_type=UTC_NAIVE)
    archive: str | None = Field(default=None, max_length=1024)


class ReportOptOut(SQLModel, table=True):
    """Users who asked for no per-job efficiency cards (``gpueff report optout USER``)."""

    __tablename__ = "report_optout"

    user: str = Field(primary_key=True, max_length=128)
    created_at: datetime = Field(sa_type=UTC_NAIVE)
    note: str | None = Field(default=None, max_length=512)


class UsageRollup(SQLModel, table=True):
    """Per-day and per-month sums of the job summaries (docs/DESIGN.md, "Roll up"). A job counts on the
    UTC day (and month) it ended; a sum is NULL when no job of the group had that figure measured. Month
    rows are by verdict; day rows are not (their ``verdict`` is NULL)."""

    __tablename__ = "usage_rollup"
    __table_args__ = (Index("ix_usage_rollup_period_start", "period", "period_start"),)

    id: int | None = Field(default=None, primary_key=True)
    period: str = Field(max_length=8)  # "day" | "month"
    period_start: date = Field(sa_type=Date)
    cluster: str = Field(max_length=64)
    user: str | None = Field(default=None, max_length=128)
    account: str | None = Field(default=None, max_length=128)
    verdict: str | None = Field(default=None, max_length=32)
    jobs: int = 0
    gpu_hours: float | None = None
    idle_gpu_hours: float | None = None
    underfilled_gpu_hours: float | None = None
    sm_active_gpu_hours: float | None = None
    tensor_active_gpu_hours: float | None = None
    energy_j: float | None = None
    kernel_measured_gpu_hours: float | None = None
    sm_measured_gpu_hours: float | None = None
    tensor_measured_gpu_hours: float | None = None
    refreshed_at: datetime = Field(sa_type=UTC_NAIVE)


class RollupPending(SQLModel, table=True):
    """Months a job's end time moved out of, so stale although no job in them was analysed: noted by the
    moving writer in its transaction (storage.rollups.note_moved), removed by the refresh."""

    __tablename__ = "rollup_pending"

    month: date = Field(sa_type=Date, primary_key=True)  # first day of the month
    noted_at: datetime = Field(sa_type=UTC_NAIVE)


class LiveSample(SQLModel, table=True):
    """A running job GPU's cumulative figures at one of its live records: the idle-GPU policy differences
    the newest and one a window older for an exact sliding-window mean (service/alerts.py); removed once
    the job has ended. ``covered_s``: seconds measured so far; ``kernel_s``, ``sm_s``: activity x seconds."""

    __tablename__ = "live_sample"
    __table_args__ = (UniqueConstraint("job_pk", "node", "gpu_index", "as_of", name="uq_live_sample_job_gpu_as_of"),)

    id: int | None = Field(default=None, primary_key=True)
    job_pk: int = Field(foreign_key="job.id", ondelete="CASCADE")
    node: str = Field(max_length=128)
    gpu_index: int
    as_of: datetime = Field(sa_type=UTC_NAIVE)
    covered_s: float
    kernel_s: float | None = None
    sm_s: float | None = None


class AlertLog(SQLModel, table=True):
    """The idle-GPU policy's audit (``gpueff alerts log``): each decision that changed something about a
    running job (idle seen, exempt, recovered) and each action (warning mail, cancel), with what was seen,
    whether it was a dry run, and how the action went."""

    __tablename__ = "alert_log"

    id: int | None = Field(default=None, primary_key=True)
    at: datetime = Field(sa_type=UTC_NAIVE, index=True)
    cluster: str = Field(max_length=64)
    job_id: int = Field(sa_type=BigInteger, index=True)
    run: int = 0
    user: str | None = Field(default=None, max_length=128)
    account: str | None = Field(default=None, max_length=128)
    action: str = Field(max_length=32)
    dry_run: bool = False
    detail: str = Field(default="", max_length=2048)
    outcome: str | None = Field(default=None, max_length=512)
