"""The one shape of a stored job: what the analysis, the renderers, the reports and seff-gpu's engine read.

A job's rows reach them from three places, and only these make them: the ORM query path
(storage/queries.py, on any database), seff-gpu's SQLite fast path (seff/sqlite_read.py, the standard
library only) and the node's live view of a running job (seff/livecard.py, from the live record, with no
database at all). Each hands its column values to :func:`job_row` and :func:`gpu_row`; every reader then sees
frozen rows whose fields are the tables' columns, typed as models.py declares them, with the two JSON
columns that carry structure (``window``, ``shared``) turned into :class:`Window` and :class:`Shared`.

Validation happens once, when a record is ingested (record.py); these constructors only narrow what the
database gives back to the declared types, so that nothing downstream asks ``isinstance`` of a value again.
A column a database not yet upgraded lacks (seff-gpu never migrates) takes the default the model gives it.

This module imports no SQLAlchemy: the node's live card and seff-gpu's fast path use it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Final, Protocol

# A GPU's coarse timeline: ``[[t_offset_s, kernel, sm, tensor], ...]`` as ingest stores it.
Points = Sequence[Sequence[float | None]]
Gap = tuple[float, float, str]  # [from, to, why]: the agent was down


def _number(v: object) -> float | None:
    """A stored number as it was stored (an int stays an int, so a value prints as before); None else."""
    return v if isinstance(v, int | float) and not isinstance(v, bool) else None


def _text(v: object) -> str | None:
    return v if isinstance(v, str) else None


def _flag(v: object) -> bool | None:
    return v if isinstance(v, bool) else None


def _gap(g: object) -> Gap | None:
    """A stored ``[from, to, why]``; None for anything else."""
    if not isinstance(g, list | tuple) or len(g) != 3:
        return None
    start, end = _number(g[0]), _number(g[1])
    return None if start is None or end is None else (start, end, str(g[2]))


@dataclass(frozen=True, slots=True)
class Window:
    """How a GPU's window was taken (record.py ``window``; docs/FIGURES.md "The job's window"): the readings'
    times, how far before each hook each end was read and whether on its request, the agent's gaps, and why
    continuity was lost."""

    start: float | None = None
    end: float | None = None
    start_offset_s: float | None = None
    end_offset_s: float | None = None
    start_exact: bool | None = None
    end_exact: bool | None = None
    gaps: tuple[Gap, ...] = ()
    broken: str | None = None  # the record's ``break``

    @classmethod
    def of(cls, value: object) -> Window | None:
        if not isinstance(value, Mapping):
            return None
        gaps = tuple(gap for g in value.get("gaps") or () if (gap := _gap(g)) is not None)
        return cls(start=_number(value.get("start")), end=_number(value.get("end")),
                   start_offset_s=_number(value.get("start_offset_s")), end_offset_s=_number(value.get("end_offset_s")),
                   start_exact=_flag(value.get("start_exact")), end_exact=_flag(value.get("end_exact")),
                   gaps=gaps, broken=_text(value.get("break")))


# The keys of the record's ``shared`` object (record.py), in the agent's order (collectors/nvml.py).
SHARED_KEYS: Final = ("with", "with_count", "method", "share", "shared_s", "unmeasured_s", "unattributed",
                      "gpu_kernel_active")


@dataclass(frozen=True, slots=True)
class Shared:
    """A GPU other jobs held too while the job ran, its part measured per job (record.py ``shared``)."""

    others: tuple[str, ...] = ()  # the record's ``with``: other jobs' ids, at most record.MAX_WITH
    with_count: int = 0  # how many other jobs in all
    method: str | None = None  # how the job's own part was measured
    share: float | None = None  # the time-weighted 1/n of the GPU the job held
    shared_s: float | None = None  # seconds held with other jobs
    unmeasured_s: float | None = None  # seconds no job's part could be measured (MPS)
    unattributed: float | None = None  # of the GPU's kernel time, what no job's process accounted for
    gpu_kernel_active: float | None = None  # the whole GPU's kernel activity over the window, every job's
    # The keys the stored object had, in its order: ``--json`` gives the object back as it was recorded.
    keys: tuple[str, ...] = field(default=SHARED_KEYS, compare=False, repr=False)

    @classmethod
    def of(cls, value: object) -> Shared | None:
        if not isinstance(value, Mapping):
            return None
        others = tuple(str(j) for j in value.get("with") or () if isinstance(j, str | int))
        count = value.get("with_count")
        return cls(others=others, with_count=count if isinstance(count, int) and not isinstance(count, bool)
                   else len(others), method=_text(value.get("method")), share=_number(value.get("share")),
                   shared_s=_number(value.get("shared_s")), unmeasured_s=_number(value.get("unmeasured_s")),
                   unattributed=_number(value.get("unattributed")),
                   gpu_kernel_active=_number(value.get("gpu_kernel_active")),
                   keys=tuple(k for k in value if k in SHARED_KEYS))

    def as_json(self) -> dict[str, object]:
        """The record's object under its own keys, in its order (``--json``)."""
        values: dict[str, object] = {
            "with": list(self.others), "with_count": self.with_count, "method": self.method, "share": self.share,
            "shared_s": self.shared_s, "unmeasured_s": self.unmeasured_s, "unattributed": self.unattributed,
            "gpu_kernel_active": self.gpu_kernel_active}
        return {k: values[k] for k in self.keys}


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRow:
    """One run of a Slurm job (the ``job`` table's columns; their meaning: models.Job)."""

    id: int | None = None
    cluster: str
    job_id: int
    run: int = 0
    sluid: str | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    job_name: str | None = None
    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    nodelist: str | None = None
    gpu_count: int = 0
    gpu_type: str | None = None
    submit_time: datetime | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    elapsed_s: float | None = None
    alloc_cpus: int | None = None
    total_cpu_s: float | None = None
    max_rss_bytes: int | None = None
    state: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    backend: str = "none"
    reason: str | None = None
    record_source: str = "hook"
    enriched: bool = False
    ingested_at: datetime | None = None
    gpu_hours: float | None = None
    idle_gpu_hours: float | None = None
    underfilled_gpu_hours: float | None = None
    sm_active_gpu_hours: float | None = None
    tensor_active_gpu_hours: float | None = None
    kernel_active: float | None = None
    sm_active: float | None = None
    tensor_active: float | None = None
    energy_j: float | None = None
    verdict: str | None = None
    verdict_title: str | None = None
    gpu_verdicts: Mapping[str, Sequence[float]] | None = None
    analyzed_at: datetime | None = None

    @property
    def live(self) -> bool:
        """A running job's row: its live records so far (models.LIVE)."""
        return self.record_source == LIVE_SOURCE


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuRow:
    """One GPU of one job on one node (the ``job_gpu`` table's columns; their meaning: models.JobGpu)."""

    id: int | None = None
    job_pk: int | None = None  # None: a row not stored (the live view's)
    node: str
    gpu_index: int
    minor: int | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    model: str | None = None
    memory_total_bytes: int | None = None
    start_time: datetime | None = None
    end_time: datetime | None = None
    kernel_active: float | None = None
    sm_active: float | None = None
    sm_occupancy: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    fp64_active: float | None = None
    fp32_active: float | None = None
    fp16_active: float | None = None
    hmma_active: float | None = None
    imma_active: float | None = None
    dfma_active: float | None = None
    memory_used_peak_bytes: int | None = None
    energy_j: float | None = None
    power_mean_w: float | None = None
    source: str = "none"
    samples: int = 0
    missing: Mapping[str, str] = field(default_factory=dict)
    xid_errors: int | None = None
    throttle_s: Mapping[str, float] | None = None
    processes: Sequence[int] | None = None
    mig_uuid: str | None = None
    mig_profile: str | None = None
    mig_gi_id: int | None = None
    mig_ci_id: int | None = None
    window_s: float | None = None
    measured_s: float | None = None
    window: Window | None = None
    shards: int | None = None
    shard_count: int | None = None
    shared: Shared | None = None


LIVE_SOURCE: Final = "live"  # job.record_source of a running job's row
JOB_COLUMNS: Final = tuple(f.name for f in fields(JobRow))
GPU_COLUMNS: Final = tuple(f.name for f in fields(GpuRow))


class Columns(Protocol):
    """A row's values by column name: a dict, or what a database driver gives (SQLAlchemy's RowMapping)."""

    def __contains__(self, name: object, /) -> bool: ...
    def __getitem__(self, name: str, /) -> object: ...


def job_row(values: Columns) -> JobRow:
    """A job row from its columns' values as the database (or ingest's merge) gives them; a column absent
    takes the model's default. The values are trusted to have the columns' types: ingest validated them."""
    return JobRow(**{name: values[name] for name in JOB_COLUMNS if name in values})  # type: ignore[arg-type]


def gpu_row(values: Columns) -> GpuRow:
    """A GPU row likewise; ``window`` and ``shared`` become their classes, a NULL ``missing`` no reasons."""
    out = {name: values[name] for name in GPU_COLUMNS if name in values}
    out["window"] = Window.of(out.get("window"))
    out["shared"] = Shared.of(out.get("shared"))
    out["missing"] = out.get("missing") or {}
    return GpuRow(**out)  # type: ignore[arg-type]
