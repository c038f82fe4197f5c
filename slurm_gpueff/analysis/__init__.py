"""Analysis: a job's figures (GPU-hours, activity, waste split) and its diagnosis. Imports models only."""

from __future__ import annotations

from .diagnose import Diagnosis, assess, diagnose
from .figures import GpuFigures, JobFigures, Waste, job_figures

__all__ = ["Diagnosis", "GpuFigures", "JobFigures", "Waste", "assess", "diagnose", "job_figures"]
