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


WIDE = "\uff17\uff10\uff10\uff13"  # ７００３
ARABIC = "\u0667\u0660\u0660\u0663"  # ٧٠٠٣


def test_ids_from_slurms_commands_are_ascii_digits_only():
    """What sacct and squeue print is read as ids only when it is 0-9, as Slurm writes them: a look-alike
    (another script's digits, which int() and \\d take) names no job."""
    from slurm_gpueff.slurm.commands import parse_squeue
    from slurm_gpueff.slurm.jobid import is_digits
    from slurm_gpueff.slurm.sacct_rows import SacctJob, ids_from_text, job_ids_of, parse_exit_codes, to_int
    from slurm_gpueff.slurm.sacct_steps import parse_steps

    assert is_digits("7003") and not is_digits(WIDE) and not is_digits(ARABIC) and not is_digits("7\u00b2")
    assert parse_squeue(f"7003 1 gpu normal RUNNING\n{WIDE} 1 gpu normal RUNNING\n").keys() == {7003}
    assert job_ids_of(f"7003|7003\n{ARABIC}|{ARABIC}\n") == {7003: "7003"}
    assert to_int("7003") == 7003 and to_int(WIDE) is None and to_int(ARABIC) is None
    assert list(parse_exit_codes(f"7003|0:0\n{WIDE}|0:0\n")) == [(7003, None)]
    assert parse_steps(f"7003|7003|4|00:01:00|\n{WIDE}|{WIDE}|4|00:01:00|\n").keys() == {7003}
    job = SacctJob(job_id=9, job_id_text=f"{WIDE}_{ARABIC}")
    ids_from_text(job)
    assert job.array_job_id is None and job.array_task_id is None
    job = SacctJob(job_id=9, job_id_text="7003_3")
    ids_from_text(job)
    assert (job.array_job_id, job.array_task_id) == (7003, 3)
