"""Every simulated profile, through the real SimulatedCollector -> spool record -> analysis (no DB),
gives its expected primary verdict. (Simulated GPUs stand in for real ones; that is their purpose.)"""

from __future__ import annotations

import pytest
from record_rows import from_record
from sites import sim_record

from slurm_gpueff import record
from slurm_gpueff.analysis import assess, job_figures
from slurm_gpueff.analysis.verdicts import RULES
from slurm_gpueff.analysis.verdicts.base import load_text
from slurm_gpueff.collectors.simulated import PROFILES
from slurm_gpueff.config import Config

EXPECTED = {
    "idle": ("never_used", "GPU never used"),
    "one-sm-spin": ("busy_not_working", None),
    "tiny-kernels": ("busy_not_working", None),
    "starved": ("starved", None),
    "fp32-no-tensor": ("tensor_idle", None),
    "memory-bound": ("memory_bound", None),
    "oversized": ("oversized", None),
    "bf16-healthy": ("healthy", None),
    "fp64-dgemm": ("healthy", None),
    "int8-gemm": ("healthy", None),
    "one-of-n-gpus": ("never_used", "3 of 4 GPUs never used"),
}


def test_every_profile_has_an_expectation():
    assert set(EXPECTED) == set(PROFILES)


@pytest.mark.parametrize("profile", sorted(EXPECTED))
@pytest.mark.parametrize("job_id", [4201, 90017])  # the jitter depends on the job id
def test_profile_primary_verdict(profile, job_id):
    config = Config()
    gpus = [0, 1, 2, 3] if profile == "one-of-n-gpus" else [0]
    rec = record.validate(sim_record(job_id, profile, len(gpus), 3.0))
    fig = job_figures(*from_record(rec))
    diag = assess(fig, config.analysis)
    name, title = EXPECTED[profile]
    assert diag.primary is not None and diag.primary.name == name, [v.name for v in diag.verdicts]
    if title:
        assert diag.primary.title == title
    assert diag.skipped == []
    assert fig.sources["sm_active"] == "simulated"
    assert fig.hours == pytest.approx(3.0 * len(gpus))


@pytest.mark.parametrize("rule", RULES, ids=lambda r: r.name)
def test_message_texts_are_complete(rule):
    text = load_text(rule.name)
    assert 2 <= len(text["advice"]) <= 3
    assert rule.label and "{" not in rule.label
