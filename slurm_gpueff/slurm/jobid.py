"""Parse the job ids users type: ``123``, array tasks ``123_4``, heterogeneous components ``123+1``.

Also accepts step suffixes (``123.batch``, ``123_4.0``) by dropping the step, because people paste them
from sacct. Digits are ASCII's 0-9 only, as Slurm writes them: ``int()`` and ``\\d`` read every script's
decimal digits (``７００３``, ``٧٠٠٣``), which made a look-alike text name a job that nobody typed. Every
parser of ids (users', sacct's, squeue's, the environment's, file names) uses :func:`is_digits` or an
``re.ASCII`` pattern for the same reason. Stdlib only.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..errors import JobIdError
from .hookenv import MAX_ID

# Slurm's job ids, array task ids and het offsets are 32-bit unsigned (NO_VAL = 0xfffffffe and up are
# markers): a larger number is no job, and would not fit the database's integers.
_MAX_DIGITS = len(str(MAX_ID))  # longer numbers are refused before int(), which refuses 4300+ digits itself
_SHOWN = 64  # characters of a bad id echoed in the message: a pasted megabyte stays one short line
_RE = re.compile(r"^(?P<job>\d+)(?:_(?P<task>\d+)|\+(?P<het>\d+))?(?:\.(?:batch|extern|interactive|\d+))?$", re.ASCII)
_OTHER_DIGIT = re.compile(r"(?![0-9])\d")  # a decimal digit of another script (str patterns match any by default)


def is_digits(text: str) -> bool:
    """Whether ``text`` is one or more ASCII digits: what Slurm writes for an id, and nothing that only looks
    like one (``str.isdigit`` is also true of other scripts' digits and of superscripts)."""
    return text.isascii() and text.isdigit()


class JobSpec(NamedTuple):
    """A parsed job id. ``task`` is set for ``123_4``, ``het_offset`` for ``123+1``."""

    job: int
    task: int | None = None
    het_offset: int | None = None

    @property
    def one_part(self) -> bool:
        """A task (``123_4``) or a het component (``123+1``): one part of a job, not the id of a whole one."""
        return self.task is not None or self.het_offset is not None

    def __str__(self) -> str:
        if self.task is not None:
            return f"{self.job}_{self.task}"
        if self.het_offset is not None:
            return f"{self.job}+{self.het_offset}"
        return str(self.job)


def _shown(text: str) -> str:
    """The id as the message echoes it: repr (control characters and line breaks escaped: one line), cut short."""
    return repr(text) if len(text) <= _SHOWN else f"{text[:_SHOWN]!r}... ({len(text)} characters)"


def parse(text: str) -> JobSpec:
    """Parse one job id or raise JobIdError saying what a valid id looks like.

    Digits are ASCII's 0-9 (another script's digits are refused, saying so), leading zeros are allowed; each
    number must fit Slurm's 32 bits."""
    m = _RE.fullmatch(text.strip())
    if not m:
        if _OTHER_DIGIT.search(text):
            raise JobIdError(f"invalid job id {_shown(text)}: job ids are written with the digits 0-9 only (this "
                             "one has digits of another script, e.g. full-width ones)")
        raise JobIdError(f"invalid job id {_shown(text)}: expected a number like 123, an array task like 123_4, "
                         "or a heterogeneous component like 123+1")
    job, task, het = (None if n is None else n.lstrip("0") or "0" for n in m.group("job", "task", "het"))
    if any(n is not None and (len(n) > _MAX_DIGITS or int(n) > MAX_ID) for n in (job, task, het)):
        raise JobIdError(f"invalid job id {_shown(text)}: Slurm's job ids, array tasks and het offsets are at "
                         f"most {MAX_ID}")
    return JobSpec(int(job or 0), None if task is None else int(task), None if het is None else int(het))
