"""The collector interface and the pieces every backend shares.

The Prolog's ``start(job)`` returns a small JSON-able start state, saved as ``<state_dir>/jobs/<job_id>.json``;
the Epilog's ``stop(job, start_state)`` returns one GPU dict (:mod:`slurm_gpueff.record`) per allocated GPU.
``start_state`` is ``None`` when the Prolog did not run or its state was lost: measure what can be, say why not.
"""

from __future__ import annotations

import os
import re

from ..record import empty_gpu

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..config import Config


# Why a backend measured nothing at the Epilog: the Prolog's start state is missing (the Prolog did not run, or
# its state was lost: a node that crashed and rebooted mid-job). Every backend says it in these words.
NO_START = "no start state: the Prolog did not run or its saved state was lost"


class JobContext:
    """What the hook knows about the job from Slurm's environment (plus the clock). ``gpu_indexes`` are
    Slurm's (SLURM_JOB_GPUS), *not* NVML indexes: see :func:`slurm_index_to_minor`."""

    __slots__ = ("job_id", "node", "cluster", "gpu_indexes", "start_time", "end_time", "env")

    def __init__(self, job_id: int, node: str, cluster: str, gpu_indexes: list[int],
                 start_time: float | None = None, end_time: float | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.job_id = job_id
        self.node = node
        self.cluster = cluster
        self.gpu_indexes = gpu_indexes
        self.start_time = start_time
        self.end_time = end_time
        self.env = env if env is not None else {}


class Measurement:
    """What a collector reports for one job on one node."""

    __slots__ = ("backend", "reason", "gpus")

    def __init__(self, backend: str, gpus: list[dict[str, Any]], reason: str | None = None) -> None:
        self.backend = backend
        self.gpus = gpus
        self.reason = reason


class Collector:
    """``name`` is the backend label stored with every figure."""

    name = "none"

    def __init__(self, config: Config) -> None:
        self.config = config

    def start(self, job: JobContext) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError

    def stop(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:  # pragma: no cover
        raise NotImplementedError

    def peek(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        """A running job's figures so far (``job.end_time``: now), leaving its measurement running. A backend
        that can only read a job at its end says so instead."""
        reason = f"the {self.name} backend gives a job's figures at its end only (no live figures)"
        return Measurement(self.name, [empty_gpu(i, self.name, reason) for i in job.gpu_indexes], reason)


class NoneCollector(Collector):
    """Allocation only: which GPUs the job held and why nothing more is known. Used when no GPU backend
    answers (or the site chose ``backend = "none"``)."""

    def __init__(self, config: Config, reason: str = "no GPU collector configured (backend = none)") -> None:
        super().__init__(config)
        self.reason = reason

    def start(self, job: JobContext) -> dict[str, Any]:
        return {"backend": self.name}

    def peek(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        return self.stop(job, start_state)

    def stop(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        minors = slurm_index_to_minor(job.gpu_indexes, self.config.collector.dev_dir)
        gpus = [empty_gpu(i, self.name, self.reason, minor=minors.get(i)) for i in job.gpu_indexes]
        return Measurement(self.name, gpus, self.reason)


_NVIDIA_DEV = re.compile(r"^nvidia(\d+)$", re.ASCII)


def device_minors(dev_dir: str = "/dev") -> list[int]:
    """Minor numbers of the node's /dev/nvidiaN devices, in the order Slurm indexes them (slurmd sorts
    its GRES device list by File name: for ``/dev/nvidia[0-N]``, the numeric order of N)."""
    try:
        names = os.listdir(dev_dir)
    except OSError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _NVIDIA_DEV.match(n)))


def slurm_index_to_minor(indexes: list[int], dev_dir: str = "/dev") -> dict[int, int | None]:
    """Slurm GPU index -> /dev/nvidiaN minor (None where the device does not exist). NVML's index order is
    PCI bus order, not the minor order: callers match minors, never NVML indexes."""
    minors = device_minors(dev_dir)
    return {i: (minors[i] if 0 <= i < len(minors) else None) for i in indexes}
