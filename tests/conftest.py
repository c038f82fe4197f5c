"""Shared fixtures. GPU tests skip cleanly where no NVIDIA GPU answers NVML; nothing else may skip."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from hypothesis import HealthCheck, settings  # noqa: E402
from smtputil import refusing_smtp_server, smtp_server  # noqa: E402, F401 - real SMTP servers, for tests that mail

# Hypothesis profiles (docs/development.md). "ci", the default: about 1,000 cases per fuzz test, the same cases
# on every run (derandomize), no example database, no deadline (a loaded 2-CPU CI machine). "deep": 10,000 fresh
# cases per fuzz test, to run before resolving any issue that touches a parser:
#   .venv/bin/python -m pytest -m fuzz --hypothesis-profile=deep     (or GPUEFF_HYPOTHESIS_PROFILE=deep)
# The fuzz tests take their case count from the active profile (``settings.default.max_examples``).
_QUIET = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
settings.register_profile("ci", max_examples=1_000, deadline=None, derandomize=True, database=None,
                          suppress_health_check=_QUIET)
settings.register_profile("deep", settings.get_profile("ci"), max_examples=10_000, derandomize=False)
settings.load_profile(os.environ.get("GPUEFF_HYPOTHESIS_PROFILE", "ci"))  # --hypothesis-profile=NAME wins


def _nvidia_gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):  # type: ignore[no-untyped-def]
    for item in items:  # a test that starts Slurm's daemons starts real processes: `-m process` takes it too
        if item.get_closest_marker("slurm") and not item.get_closest_marker("process"):
            item.add_marker(pytest.mark.process)
    if any("gpu" in item.keywords for item in items) and not _nvidia_gpu_present():
        skip = pytest.mark.skip(reason="no NVIDIA GPU answers NVML on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def repo_root() -> str:
    return ROOT


@pytest.fixture
def site(tmp_path):  # type: ignore[no-untyped-def]
    """The hook tests' site: a throwaway node under tmp_path (tests/hooksite.py). Modules whose tests need a job
    database override ``site`` with ``sites.job_site`` (tests/sites.py: the one record and database builder)."""
    from hooksite import HookSite

    return HookSite(str(tmp_path))


# The host may have Debian's Slurm client installed for the `slurm` group, whose 22.05 cluster runs from
# /etc/slurm beside the other tests in CI. A test outside that group must not see its jobs: `seff-gpu 5` once
# found the cluster's job 5 RUNNING and answered that instead of what the test set up. So those tests give
# Slurm's clients an empty slurm.conf: any real squeue/sacct on PATH then fails at once, as with no cluster
# (a slurm.conf that does not exist is not the same: the client retries it for 60 s).
_NO_CLUSTER = "/dev/null"


def pytest_runtest_setup(item):  # type: ignore[no-untyped-def]
    if item.get_closest_marker("slurm"):
        if os.environ.get("SLURM_CONF") == _NO_CLUSTER:
            del os.environ["SLURM_CONF"]
    else:
        os.environ["SLURM_CONF"] = _NO_CLUSTER
