"""Job ids as users type them (and paste them from sacct)."""

import pytest

from slurm_gpueff.errors import JobIdError
from slurm_gpueff.slurm.jobid import JobSpec, parse


@pytest.mark.parametrize(
    "text, spec, shown",
    [
        ("123", JobSpec(123), "123"),
        (" 123 ", JobSpec(123), "123"),
        ("123_4", JobSpec(123, task=4), "123_4"),
        ("123+1", JobSpec(123, het_offset=1), "123+1"),
        ("123.batch", JobSpec(123), "123"),
        ("123_4.0", JobSpec(123, task=4), "123_4"),
        ("4294967293", JobSpec(4294967293), "4294967293"),  # the largest id Slurm's uint32 leaves for jobs
        ("4294967293_4294967293", JobSpec(4294967293, task=4294967293), "4294967293_4294967293"),
    ],
)
def test_valid(text, spec, shown):
    assert parse(text) == spec
    assert str(parse(text)) == shown


@pytest.mark.parametrize("text", ["", "abc", "12a", "123_", "123+", "-5", "123_[1-3]", "1;rm", "123_4+1"])
def test_invalid_has_clear_message(text):
    with pytest.raises(JobIdError, match="expected a number like 123"):
        parse(text)


@pytest.mark.parametrize("text", ["4294967294", "98765432101", "99999999999999999999", "4201_9223372036854775808",
                                  "4201+18446744073709551616"])
def test_ids_beyond_slurms_32_bits_are_refused(text):
    """Slurm's ids are 32-bit; a larger number used to reach the database and end in an OverflowError."""
    with pytest.raises(JobIdError, match="at most 4294967293"):
        parse(text)
