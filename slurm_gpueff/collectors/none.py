"""Allocation-only backend: no GPU data, just which GPUs the job held and why nothing more is known."""

from __future__ import annotations

from ..record import empty_gpu
from .base import Collector, JobContext, Measurement, slurm_index_to_minor

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ..config import Config


class NoneCollector(Collector):
    """Used when no GPU backend answers (or the site chose ``backend = "none"``)."""

    name = "none"

    def __init__(self, config: Config, reason: str = "no GPU collector configured (backend = none)") -> None:
        super().__init__(config)
        self.reason = reason

    def start(self, job: JobContext) -> dict[str, Any]:
        return {"backend": self.name}

    def stop(self, job: JobContext, start_state: dict[str, Any] | None) -> Measurement:
        minors = slurm_index_to_minor(job.gpu_indexes)
        gpus = [empty_gpu(i, "none", self.reason, minor=minors.get(i)) for i in job.gpu_indexes]
        return Measurement("none", gpus, self.reason)
