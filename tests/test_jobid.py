"""Job ids as users type them (and paste them from sacct)."""

import pytest

from slurm_gpueff.errors import JobIdError
from slurm_gpueff.jobid import JobSpec, parse


@pytest.mark.parametrize(
    "text, spec, shown",
    [
        ("123", JobSpec(123), "123"),
        (" 123 ", JobSpec(123), "123"),
        ("123_4", JobSpec(123, task=4), "123_4"),
        ("123+1", JobSpec(123, het_offset=1), "123+1"),
        ("123.batch", JobSpec(123), "123"),
        ("123_4.0", JobSpec(123, task=4), "123_4"),
        ("98765432101", JobSpec(98765432101), "98765432101"),
    ],
)
def test_valid(text, spec, shown):
    assert parse(text) == spec
    assert str(parse(text)) == shown


@pytest.mark.parametrize("text", ["", "abc", "12a", "123_", "123+", "-5", "123_[1-3]", "1;rm", "123_4+1"])
def test_invalid_has_clear_message(text):
    with pytest.raises(JobIdError, match="expected a number like 123"):
        parse(text)
