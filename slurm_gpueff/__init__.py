"""slurm-gpueff: per-job GPU efficiency for Slurm clusters.

Kept import-free on purpose: the Slurm hooks import this package and must start fast.
"""

__version__ = "0.1.0"
