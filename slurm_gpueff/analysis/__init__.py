"""Analysis: a job's figures (GPU-hours, activity, waste split) and its diagnosis. Imports models only."""

from __future__ import annotations

from .diagnose import Diagnosis, assess
from .figures import GpuFigures, JobFigures, Waste, job_figures

__all__ = ["Diagnosis", "GpuFigures", "JobFigures", "Waste", "assess", "job_figures"]
