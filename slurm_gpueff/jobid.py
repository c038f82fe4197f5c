"""Parse the job ids users type: ``123``, array tasks ``123_4``, heterogeneous components ``123+1``.

Also accepts step suffixes (``123.batch``, ``123_4.0``) by dropping the step, because people paste them
from sacct. Stdlib only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import JobIdError

# Slurm's job ids, array task ids and het offsets are 32-bit unsigned (NO_VAL = 0xfffffffe and up are
# markers): a larger number is no job, and would not fit the database's integers.
MAX_ID = 0xFFFFFFFD
_RE = re.compile(r"^(?P<job>\d+)(?:_(?P<task>\d+)|\+(?P<het>\d+))?(?:\.(?:batch|extern|interactive|\d+))?$")


class JobSpec(NamedTuple):
    """A parsed job id. ``task`` is set for ``123_4``, ``het_offset`` for ``123+1``."""

    job: int
    task: int | None = None
    het_offset: int | None = None

    def __str__(self) -> str:
        if self.task is not None:
            return f"{self.job}_{self.task}"
        if self.het_offset is not None:
            return f"{self.job}+{self.het_offset}"
        return str(self.job)


def parse(text: str) -> JobSpec:
    """Parse one job id or raise JobIdError saying what a valid id looks like."""
    m = _RE.match(text.strip())
    if not m:
        raise JobIdError(f"invalid job id {text!r}: expected a number like 123, an array task like 123_4, "
                         "or a heterogeneous component like 123+1")
    task, het = m.group("task", "het")
    spec = JobSpec(int(m.group("job")), int(task) if task else None, int(het) if het else None)
    if max(n for n in spec if n is not None) > MAX_ID:
        raise JobIdError(f"invalid job id {text!r}: Slurm's job ids, array tasks and het offsets are at most {MAX_ID}")
    return spec
