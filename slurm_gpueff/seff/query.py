"""seff-gpu's question and answer as they travel: a :class:`SeffQuery` in, an :class:`Answer` out, and the exit
statuses an answer carries.

Three parties exchange these: seff-gpu (which prints an Answer), ``gpueff serve``'s API (which answers a
query for a user who may not read the database) and the node agent (a running job's card on its own node).
Stdlib only: seff-gpu's client side imports this and nothing of the engine behind it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ..access.privacy import EXIT_DENIED as EXIT_DENIED  # another user's job, and privacy is on
from ..errors import GpueffError
from ..fmt import one_line
from ..storage.dburl import UNAVAILABLE

if TYPE_CHECKING:
    from ..access.privacy import Viewer

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNKNOWN = 3
EXIT_RUNNING = 4
EXIT_NO_GPUS = 5

PROG = "seff-gpu"
TABLE_LIMIT = 100  # a table's default lines: what a user reads; the totals still cover every job
MAX_LIMIT = 10**9


class Refused(GpueffError):
    """No answer but a one-line reason, with seff-gpu's exit status for it (3 to 6, 1)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


class Unavailable(Refused):
    """The database could not be read. ``detail`` names it and says why, for administrators only (their
    Viewer's ``admin``): everybody else is told that it is unavailable (storage.dburl.UNAVAILABLE), never its
    URL, path, host or port."""

    def __init__(self, detail: str):
        super().__init__(detail, EXIT_ERROR)
        self.detail = detail

    def told(self, viewer: Viewer) -> str:
        return self.detail if viewer.admin else UNAVAILABLE


class SeffQuery(NamedTuple):
    """One seff-gpu question. ``jobid`` (text as typed) asks for cards; else a table of the jobs of
    ``user``/``account`` that ended (or, running, were last measured) in [``start``, ``end``) (ISO, naive UTC:
    the client turned local times into UTC), of the Slurm states ``state`` names. ``html``: also the HTML
    card pages."""

    jobid: str | None = None
    user: str | None = None
    account: str | None = None
    start: str | None = None
    end: str | None = None
    cluster: str | None = None
    json: bool = False
    html: bool = False
    state: str | None = None  # a table's Slurm states, comma-separated ("RUNNING", "COMPLETED,FAILED")
    limit: int = TABLE_LIMIT  # a table's lines: the newest this many jobs (0: all); its totals are over all

    def kind(self) -> str:
        """For log lines: what was asked, never which job or whose."""
        return ("card" if self.jobid is not None else "table") + ("+json" if self.json else "") + (
            "+html" if self.html else "")


class Answer(NamedTuple):
    """What seff-gpu prints (``stdout``, ``stderr`` as given), its exit status, and the HTML card pages
    to write as files: (job label, page); the label names the file when there are several. ``running``: a
    card of a job still running (``--watch`` goes on refreshing it); ``as_of``: then, the time its figures
    reach (ISO, UTC), so that ``--watch`` never shows older figures than it already showed."""

    exit_code: int
    stdout: str = ""
    stderr: str = ""
    html: list[tuple[str, str]] = []
    running: bool = False
    as_of: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "stdout": self.stdout, "stderr": self.stderr,
                "html": [list(p) for p in self.html], "running": self.running, "as_of": self.as_of}

    @classmethod
    def from_json(cls, d: Any) -> Answer:
        """The Answer from the service's JSON; ValueError if it is not one."""
        try:
            html = [(str(label), str(page)) for label, page in d["html"]]
            if not isinstance(d["exit_code"], int) or not isinstance(d["stdout"], str) or not isinstance(
                    d["stderr"], str):
                raise TypeError
            as_of = d.get("as_of")
            return cls(d["exit_code"], d["stdout"], d["stderr"], html, d.get("running") is True,
                       as_of if isinstance(as_of, str) else None)
        except (KeyError, TypeError, ValueError):
            raise ValueError("not a seff-gpu answer") from None


def failure(message: str, exit_code: int) -> Answer:
    """One line, whatever the message holds (a configured path may hold a line break), as cli.common.err."""
    return Answer(exit_code, stderr=f"{PROG}: {one_line(message.strip())}\n")
