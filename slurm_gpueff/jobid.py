"""Parse the job ids users type: ``123``, array tasks ``123_4``, heterogeneous components ``123+1``.

Also accepts step suffixes (``123.batch``, ``123_4.0``) by dropping the step, because people paste them
from sacct. Stdlib only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .errors import JobIdError

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
    return JobSpec(int(m.group("job")), int(task) if task else None, int(het) if het else None)
