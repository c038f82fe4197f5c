"""Shared fixtures. GPU tests skip cleanly where no NVIDIA GPU answers NVML; nothing else may skip."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from smtputil import smtp_server  # noqa: E402, F401 - the real SMTP server fixture, for every test that mails


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
    if any("gpu" in item.keywords for item in items) and not _nvidia_gpu_present():
        skip = pytest.mark.skip(reason="no NVIDIA GPU answers NVML on this machine")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def repo_root() -> str:
    return ROOT
