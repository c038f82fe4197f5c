"""The node agent's per-job Prometheus series: who holds which GPU now, and what that GPU is doing.

A job's series exist only while its Prolog's ``jobs/<job_id>.json`` does (the agent's per-tick scan of
those files, which also tracks peak memory), so the label set is bounded by the jobs running on this node
now: the finished jobs' history belongs to the service's rollups, never to job-id labels in Prometheus.
Each series carries the GPU's own reading at the agent's last tick while the job holds the GPU alone. On a
GPU that several jobs hold, it carries the job's part of the last interval the agent split
(:mod:`.attribution`): activities and power times the job's shares, memory its processes' own, and no
activity or power sample where its part could not be measured (MPS), so the jobs' series add up to the GPU's
rather than each claiming all of it. Only whole GPUs the agent samples get series: a MIG device shares its
parent's kernel activity and power with other jobs, so a per-job value of those would be another job's too;
MIG jobs are skipped.

Who runs a job is not in them unless the site asks (``[agent] metrics_per_user``): the endpoint is on
127.0.0.1 of a node where users' jobs run, and any of them can read it unless ``[agent] metrics_token_file``
guards it (:mod:`slurm_gpueff.access.scrape`). Without it, the series carry the job id, the GPU and its minor.

Imports only the standard library at module level; prometheus_client is imported when series are built,
as the agent's exporter does.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, NamedTuple

from .. import jobstate

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from prometheus_client.metrics_core import Metric

    from .nvml_sampler import GpuInfo

LABELS = ("job_id", "gpu", "minor")
PER_USER_LABELS = ("job_id", "user", "account", "gpu", "minor")  # with [agent] metrics_per_user
# key in the GPU's last readings (and metric name part) -> help
ACTIVITY = {
    "kernel_active": "Kernel activity (nvidia-smi's GPU utilization)",
    "sm_active": "SM activity (GPM, Hopper and newer)",
    "tensor_active": "Tensor-core activity (GPM, Hopper and newer)",
    "dram_active": "Memory-bandwidth activity (GPM, Hopper and newer)",
}


class JobFile(NamedTuple):
    """One Prolog job file as last read: re-read only when its mtime or size changes."""

    mtime_ns: int
    size: int
    uuids: list[str]
    labels: tuple[str, str, str]  # job_id, user, account


class JobPart(NamedTuple):
    """One job's part of a shared GPU over the last split interval (None: not measurable)."""

    activity: float | None
    power: float | None
    memory_used: int | None


class GpuNow(NamedTuple):
    """What the series need of one sampled GPU (a snapshot, so a scrape never sees half a tick); ``parts``
    (file name's job id -> its part) only while several jobs hold it."""

    info: GpuInfo
    last: Mapping[str, float | None]
    memory_used: int | None
    parts: Mapping[str, JobPart] = {}


def read_job_file(path: str, name_job_id: str, mtime_ns: int, size: int) -> JobFile:
    """The job's GPUs and labels; an unreadable file names no GPU (it may be complete at the next tick)."""
    with open(path, "rb") as fh:
        data = json.loads(fh.read())
    return JobFile(mtime_ns, size, jobstate.saved_uuids(data), job_labels(name_job_id, data))


def job_labels(name_job_id: str, data: object) -> tuple[str, str, str]:
    """(job_id, user, account) from the saved ``job`` object; a Prolog that saved none leaves the file name's
    job id and empty user and account (label values are strings, so unknown is "")."""
    job = data.get("job") if isinstance(data, dict) else None
    if not isinstance(job, dict):
        return name_job_id, "", ""
    job_id = job.get("job_id")
    return (str(job_id) if isinstance(job_id, int) and not isinstance(job_id, bool) else name_job_id,
            _text(job.get("user")), _text(job.get("account")))


def _text(v: Any) -> str:
    return v if isinstance(v, str) else ""


def job_series(jobs: Mapping[str, JobFile], gpus: Mapping[str, GpuNow], per_user: bool = False) -> Iterator[Metric]:
    """Per (running job, whole GPU it holds): ``gpueff_job_info`` = 1 and the GPU's last readings, or the job's
    part of them on a shared GPU; ``jobs`` by the job file name's id; the job's user and account only with
    ``per_user``. A figure the agent could not read has no sample, never a 0."""
    from prometheus_client.core import GaugeMetricFamily

    names = PER_USER_LABELS if per_user else LABELS

    def gauge(name: str, text: str) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, text, labels=names)

    info = gauge("gpueff_job_info", "1 per GPU held by a job running on this node now")
    act = {m: gauge(f"gpueff_job_gpu_{m}_ratio", f"{text} of a job's GPU at the agent's last tick, "
                 "its part on a GPU that jobs share (0-1)")
           for m, text in ACTIVITY.items()}
    used = gauge("gpueff_job_gpu_memory_used_bytes", "Memory in use on a job's GPU at the agent's last tick "
                 "(its processes' own on a GPU that jobs share)")
    power = gauge("gpueff_job_gpu_power_watts", "Power draw of a job's GPU at the agent's last tick "
                  "(its part on a GPU that jobs share)")
    for name, job in jobs.items():
        for u in job.uuids:
            g = gpus.get(u)  # a MIG UUID, or a GPU this agent does not sample, has no entry
            if g is None:
                continue
            labels = [*(job.labels if per_user else job.labels[:1]), u,
                      str(g.info.minor) if g.info.minor is not None else ""]
            info.add_metric(labels, 1.0)
            part = g.parts.get(name)
            a_share, p_share = (part.activity, part.power) if part else (1.0, 1.0)
            readings = [*((fam, _times(g.last.get(m), a_share)) for m, fam in act.items()),
                        (used, part.memory_used if part else g.memory_used),
                        (power, _times(g.last.get("power_w"), p_share))]
            for fam, v in readings:
                if v is not None:
                    fam.add_metric(labels, float(v))
    yield info
    yield from act.values()
    yield from (used, power)


def _times(v: float | None, share: float | None) -> float | None:
    """A job's part of a GPU's reading (None when either is unknown)."""
    return None if v is None or share is None else v * share
