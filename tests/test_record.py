"""The spool record validator: strict, because ingest quarantines whatever it rejects."""

from __future__ import annotations

import copy

import pytest

from slurm_gpueff.errors import RecordError
from slurm_gpueff.record import METRICS, empty_gpu, validate


def good() -> dict:
    gpu = empty_gpu(0, "nvml-gpm", None, uuid="GPU-1", model="H100")
    gpu.update(kernel_active=1.0, sm_active=0.0076, energy_j=1234.5, memory_used_peak_bytes=10**9, samples=7,
               timeline=[[5.0, 1.0, 0.0076, 0.0]])
    return {"schema": 1, "cluster": "c", "node": "n1", "job_id": 42, "start_time": 1.7e9, "end_time": 1.7e9 + 60,
            "backend": "nvml-gpm", "gpus": [gpu], "user": "alice", "uid": 1000, "exit_code": 0}


def test_good_record_passes():
    rec = good()
    assert validate(rec) is rec


def test_empty_gpu_marks_every_metric_missing_not_zero():
    gpu = empty_gpu(3, "none", "agent not running")
    assert all(gpu[m] is None for m in METRICS)
    assert gpu["missing"] == {m: "agent not running" for m in METRICS}


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r.pop("job_id"), "missing required field 'job_id'"),
        (lambda r: r.update(schema=2), "unsupported schema 2"),
        (lambda r: r.update(job_id="42"), "job_id must be an integer"),
        (lambda r: r.update(job_id=0), "job_id must be a positive integer"),
        (lambda r: r.update(end_time=1.0), "end_time is before start_time"),
        (lambda r: r.update(start_time=float("nan")), "start_time must be a positive epoch time"),
        (lambda r: r.update(backend="magic"), "unknown backend"),
        (lambda r: r["gpus"][0].update(sm_active=1.5), "gpus[0].sm_active must be a fraction"),
        (lambda r: r["gpus"][0].update(kernel_active=True), "gpus[0].kernel_active must be a fraction"),
        (lambda r: r["gpus"][0].update(energy_j=-1), "gpus[0].energy_j must be a non-negative number"),
        (lambda r: r["gpus"][0].update(index=-1), "gpus[0].index must be a non-negative integer"),
        (lambda r: r["gpus"].append(copy.deepcopy(r["gpus"][0])), "duplicate GPU index 0"),
        (lambda r: r["gpus"][0].update(timeline=[[1, 2]]), "timeline must be a list"),
        (lambda r: r.update(node=""), "cluster and node must be non-empty"),
        (lambda r: r.update(user=5), "user must be a string"),
    ],
)
def test_bad_records_are_rejected_with_the_reason(mutate, message):
    rec = good()
    mutate(rec)
    with pytest.raises(RecordError) as err:
        validate(rec)
    assert message in str(err.value)


def test_non_object_rejected():
    with pytest.raises(RecordError, match="expected a JSON object"):
        validate([1, 2])


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(end_time=1e15), "before the year 10000"),
    (lambda r: r.update(run=2**31), "run = 2147483648 is beyond what the database holds"),
    (lambda r: r.update(exit_code=2**40), "exit_code = 1099511627776 is beyond"),
    (lambda r: r.update(job_id=2**63), "job_id = 9223372036854775808 is beyond"),
    (lambda r: r["gpus"][0].update(index=2**31), r"gpus\[0\].index = 2147483648 is beyond"),
    (lambda r: r["gpus"][0].update(samples=2**40), r"gpus\[0\].samples = 1099511627776 is beyond"),
    (lambda r: r["gpus"][0].update(memory_total_bytes=2**63), r"gpus\[0\].memory_total_bytes must be"),
])
def test_values_beyond_the_database_columns_are_rejected(mutate, message):
    """A record the database cannot hold would fail its whole batch at every ingest: it is refused (quarantined)."""
    rec = copy.deepcopy(good())
    mutate(rec)
    with pytest.raises(RecordError, match=message):
        validate(rec)
