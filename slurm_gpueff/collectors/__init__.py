"""Collector backends: measure what a job's GPUs did between its Prolog and Epilog.

Every backend implements :class:`slurm_gpueff.collectors.base.Collector`. This package is on the hook
path: stdlib only at import time; a backend imports its heavy library (pynvml, DCGM) lazily.
Annotation-only imports (the config's type, typing) sit under ``if TYPE_CHECKING:``.
Collectors never import storage, analysis, render or cli (enforced by tests/test_layering.py).
"""
