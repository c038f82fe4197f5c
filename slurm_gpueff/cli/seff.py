"""``seff-gpu JOBID``: the GPU efficiency card of a finished Slurm job, in the spirit of ``seff``.

Exit codes: :data:`EPILOG`. An id that names more than ``MAX_CARDS`` jobs (an array with its tasks) prints
a one-line-per-job table instead of the cards; ``--json`` always carries every job.

``seff-gpu -u USER [-A ACCOUNT] [-S START] [-E END] [--json]``: one line per job, with totals, from the
per-job summary columns (written at ingest by slurm_gpueff.service.summarize). Times are local (like sacct; turned
into UTC here, so the service's time zone does not matter) and select jobs by their end time; defaults:
the last 7 days up to now.

One flow: the arguments -> a :class:`SeffQuery` -> an :class:`Answer` -> printed, its HTML pages written
as files by this process (as the calling user), its exit status returned. The Answer comes from
:func:`seff.answer.answer`, run here when this user may read the database (root, the service account,
the demo: :func:`direct`), else by ``gpueff serve``'s API (service/api.py), which learns who asks from a
MUNGE credential. The service path imports nothing beyond the standard library.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ..seff.query import EXIT_DENIED, EXIT_ERROR, EXIT_UNKNOWN, MAX_LIMIT, TABLE_LIMIT, Answer, SeffQuery
from .common import CONFIG_HELP, CONFIG_NOTE, CommandError, OneLineParser, UsageError, run_command

if TYPE_CHECKING:
    from ..access.privacy import Viewer
    from ..config import Config, ServiceConfig

__all__ = ["main"]

TABLE_DAYS = 7  # -u/-A without -S: the jobs of the last week
# Forces the service path (tests, benchmarks); not for users: a user who can read the database reads it.
VIA_ENV = "GPUEFF_SEFF_VIA"

DESCRIPTION = """\
Show how well a finished Slurm job used its GPUs: allocated GPU-hours, kernel
activity (what nvidia-smi calls "GPU utilization"), SM activity (the share of the
GPU's multiprocessors actually busy), tensor-core and memory-bandwidth activity,
peak GPU memory, energy, where the GPU-hours went, a verdict in plain words and
what to try. Figures that were not measured read "n/a (reason)", never 0."""

EPILOG = """\
job ids:
  123        a job (for an array or heterogeneous job: all its tasks/components)
  123_4      task 4 of array job 123
  123+1      component 1 of heterogeneous job 123

examples:
  seff-gpu 4201
  seff-gpu 4201 --watch 60        # a running job's figures so far, refreshed
  seff-gpu -u alice -s RUNNING    # alice's running jobs
  seff-gpu 4201 --json | jq '.jobs[0].waste'
  seff-gpu 777_3 --cluster hpc1
  GPUEFF_CONFIG=/path/gpueff.toml seff-gpu 4201

exit status:
  0 ok, 1 error (e.g. database unreachable), 2 bad usage or job id (also:
    --html FILE exists and no --force; a symbolic link is never followed),
  3 job unknown, 4 job still running or pending with no figures yet,
  5 job had no GPUs,
  6 another user's job (you see your own, your accounts' as their lead or
    coordinator, every job as an admin; [privacy] and [leads] in the
    config); where Slurm's PrivateData hides jobs, such a job is 3, as
    one that does not exist; 130 stopped by Ctrl-C (SIGINT), 143 by SIGTERM

Where the job database is private to the service account, seff-gpu asks
`gpueff serve` for the answer, proving who you are with MUNGE.

""" + CONFIG_NOTE


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="seff-gpu", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jobid", nargs="?", help="Slurm job id: 123, 123_4 (array task) or 123+1 (het component)")
    # Many jobs: a reportseff-style table from the stored summaries (_table).
    p.add_argument("-u", "--user", help="list this user's jobs (one line each, with totals) instead of a card")
    p.add_argument("-A", "--account", help="list this account's jobs (with -u: that user's jobs in it)")
    p.add_argument("-S", "--starttime", dest="start", metavar="TIME", help="jobs that ended from TIME (local; "
                   "YYYY-MM-DD[THH:MM]; default 7 days ago)")
    p.add_argument("-E", "--endtime", dest="end", metavar="TIME", help="jobs that ended before TIME (default now)")
    p.add_argument("-s", "--state", metavar="LIST", help="a table's jobs in these Slurm states only, comma-"
                   "separated, e.g. RUNNING or COMPLETED,FAILED (default: all)")
    p.add_argument("--watch", type=float, metavar="SECONDS", help="a running job's card: show it again every "
                   "SECONDS (at least 2) until the job ends or Ctrl-C")
    p.add_argument("--limit", type=_limit, default=TABLE_LIMIT, metavar="N",
                   help=f"a table's lines: the newest N jobs (default {TABLE_LIMIT}; 0: every job); its totals are "
                   "over every job either way")
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    p.add_argument("--html", metavar="FILE", help="also write the card as an HTML page (the mailed card, one "
                   "self-contained file; several jobs: FILE-<jobid>.html); an existing file is not overwritten, "
                   "nor a symbolic link followed (exit 2)")
    p.add_argument("--force", action="store_true", help="--html: replace an existing FILE (a symbolic link is "
                   "replaced itself, never its target)")
    p.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    p.add_argument("--cluster", metavar="NAME", help="only jobs of this cluster (default: any cluster in the "
                   "database)")
    return p


def _refuse_conflicts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A JOBID shows cards, -u/-A a table of jobs: a flag of the one mode is refused in the other."""
    table = [flag for flag, value in (("-u/--user", args.user), ("-A/--account", args.account),
                                      ("-S/--starttime", args.start), ("-E/--endtime", args.end)) if value]
    if args.jobid is None and not (args.user or args.account):
        parser.error("give a JOBID, or -u USER / -A ACCOUNT for a table of jobs")
    if args.jobid is not None and table:
        parser.error(f"{', '.join(table)} (a table of jobs) cannot be combined with a JOBID (a job's card)")
    if args.jobid is None and args.html:
        parser.error("--html writes a job's card: give a JOBID, not -u/-A")
    if args.force and not args.html:
        parser.error("--force replaces the --html FILE: give --html FILE")
    if args.jobid is not None and args.state:
        parser.error("-s/--state filters a table of jobs (-u/-A), not a JOBID's card")
    if args.state:
        from ..slurm.sacct_rows import ACTIVE_STATES, FINAL_STATES

        unknown = [s for s in args.state.upper().split(",") if s.strip() not in FINAL_STATES | ACTIVE_STATES]
        if unknown:
            parser.error(f"-s/--state: {', '.join(repr(s.strip()) for s in unknown)} is not a Slurm job state; "
                         f"ended: {', '.join(sorted(FINAL_STATES))}; not ended: RUNNING, PENDING, ...")
    if args.watch is not None and not 2 <= args.watch <= 86400:
        parser.error(f"--watch SECONDS: every 2 to 86400 seconds, got {args.watch:g}")
    if args.watch is not None and (args.jobid is None or args.json or args.html):
        parser.error("--watch refreshes a JOBID's text card: not with -u/-A, --json or --html")




def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _refuse_conflicts(parser, args)
    return run_command("seff-gpu", _run, args)


def _run(args: argparse.Namespace) -> int:
    from ..config import load
    from ..slurm.jobid import parse

    if args.jobid is not None:
        parse(args.jobid)  # a bad id is refused before the config is read
    config = load(args.config)
    query = SeffQuery(args.jobid, args.user, args.account, *_times(args), args.cluster, args.json, bool(args.html),
                      args.state, args.limit)
    if args.watch is not None:
        return watch(lambda: _ask(query, config), args.watch)
    return emit(_ask(query, config), args.html, args.force)


def _ask(query: SeffQuery, config: Config) -> Answer:
    here = on_node(query, config) if query.jobid is not None and not query.html else None
    if here is not None:
        return here
    if direct(config):
        from ..seff.answer import answer

        return answer(query, config, _own_viewer(config))
    return ask_service(query, config.service)


def on_node(query: SeffQuery, config: Config) -> Answer | None:
    """On the node where the job runs, its card up to the second from the node agent (node/live_socket.py);
    None where no agent answers, the job does not run here, or the agent may not show it to this user (the
    usual path then answers: the service knows the account coordinators, the node does not ask)."""
    from ..node.live_socket import ask

    got = ask(config.paths.state_dir, str(query.jobid), query.json, config.service.api_timeout_s)
    try:
        here = Answer.from_json(got) if got is not None else None
    except ValueError:
        return None
    return None if here is None or here.exit_code in (EXIT_UNKNOWN, EXIT_DENIED) else here


def watch(ask: Callable[[], Answer], every_s: float) -> int:
    """``--watch``: the card again every ``every_s`` seconds, in place on a terminal (as watch(1) does),
    until the job is no longer running (its final card is the last one shown) or Ctrl-C."""
    import time

    tty = sys.stdout.isatty()
    shown: str | None = None  # as_of of the figures on screen: never replaced by older ones
    while True:
        result = ask()
        older = result.running and shown is not None and result.as_of is not None and result.as_of < shown
        if older:  # the node's up-to-the-second answer is gone (the job ended), the database still has an
            # earlier live row: keep the card on screen and say why, until the final record arrives
            stamp = datetime.now().astimezone().strftime("%H:%M:%S")
            sys.stdout.write(f"[{stamp}] the job has ended (or left this node): its final figures follow once "
                             "its record reaches the database\n")
        else:
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J")
            stamp = datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
            sys.stdout.write(f"Every {every_s:g} s: seff-gpu (Ctrl-C to stop)  {stamp}\n\n")
            code = emit(result, None)
            shown = result.as_of or shown
        sys.stdout.flush()
        if not result.running:
            return code
        try:
            time.sleep(every_s)
        except KeyboardInterrupt:
            return 0


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of lines, 0 for all")
    return n


def _times(args: argparse.Namespace) -> tuple[str | None, str | None]:
    """A table's [start, end) as naive UTC ISO text; (None, None) for cards."""
    if args.jobid is not None:
        return None, None
    end = parse_time(args.end) if args.end else datetime.now(UTC).replace(tzinfo=None)
    try:
        start = parse_time(args.start) if args.start else end - timedelta(days=TABLE_DAYS)
    except OverflowError:  # -E in the first week of year 1
        raise UsageError(f"-E {args.end}: too early for the default -S (a week before it); give -S") from None
    if start >= end:
        raise UsageError("-S/--starttime must be before -E/--endtime")
    return start.isoformat(), end.isoformat()


def parse_time(text: str) -> datetime:
    """``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM[:SS]`` in local time -> naive UTC (how the DB stores times)."""
    try:
        local = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"bad time {text!r}: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]") from None
    try:
        if local.tzinfo is None:
            local = local.astimezone()  # interpret as this host's local time
        return local.astimezone(UTC).replace(tzinfo=None)
    except (ValueError, OverflowError):  # year 1 or 9999 moved past the calendar's ends by the offset
        raise UsageError(f"bad time {text!r}: out of range once turned into UTC") from None


def emit(result: Answer, html_path: str | None, force: bool = False) -> int:
    """Write the Answer's HTML pages (``FILE``; several: ``FILE-<job>.html``), then print it; its status.
    Everything goes through :func:`fmt.visible`: a record's text cannot drive the terminal or reorder a line.

    The pages are written by :mod:`outfile`: an existing name is refused (exit 2) unless ``force``, and a
    symbolic link is never followed; every name is checked before any is written."""
    from .. import outfile
    from ..fmt import visible

    if html_path and result.html:
        stem, ext = os.path.splitext(html_path)
        outs = [html_path] if len(result.html) == 1 else [
            f"{stem}-{_file_label(label)}{ext or '.html'}" for label, _page in result.html]
        for out in outs:
            outfile.refuse_existing(out, force)
        for out, (_label, page) in zip(outs, result.html, strict=True):
            outfile.write(out, visible(page).encode("utf-8"), force=force)
            print(f"wrote {visible(out)}", file=sys.stderr)
    sys.stderr.write(visible(result.stderr))
    sys.stdout.write(visible(result.stdout))
    return result.exit_code


def _file_label(label: str) -> str:
    """A job's label (``4201``, ``5000_1``, ``13+1``) as part of a file name: anything else (a ``/`` from an
    answer that is not the service's) becomes ``_``, so a page never lands outside FILE's directory."""
    return "".join(c if c.isascii() and (c.isalnum() or c in "_+.-") else "_" for c in label).lstrip(".") or "_"


# -- the direct path ------------------------------------------------------------------------------------------

def direct(config: Config) -> bool:
    """Whether this user reads the database itself: SQLite, a file they may read (or that does not exist yet,
    which the direct path then says); a server, no password file or one they may read."""
    if os.environ.get(VIA_ENV) == "service":
        return False
    from ..storage.dburl import database_url, sqlite_file

    path = sqlite_file(database_url(config.paths.database))
    if path is None:
        pw = config.paths.database_password_file
        return not pw or os.access(pw, os.R_OK)
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:  # its directory is closed to this user
        return False
    return os.access(path, os.R_OK)


def _own_viewer(config: Config) -> Viewer:
    """This user as a Viewer; the database's owner (the SQLite file's, a server's password file's) is the
    service account (the demo's user owns theirs)."""
    from ..access.privacy import current_user, viewer
    from ..storage.dburl import owner

    uid, name = current_user()
    return viewer(config, uid, name, owner(config), lambda: coordinators(config))


def coordinators(config: Config) -> dict[str, list[str]]:
    """Slurm's account coordinators (one bounded sacctmgr call); none when it fails."""
    from ..errors import SlurmCommandError
    from ..slurm.commands import RESOLVE_TIMEOUT_S, account_coordinators

    try:
        return account_coordinators(config, min(RESOLVE_TIMEOUT_S, config.sacct.timeout_s))
    except SlurmCommandError:
        return {}


# -- the service path -----------------------------------------------------------------------------------------

PRIVATE = ("the job database is private to the service account, and no seff-gpu service is configured: an "
           "administrator must set [service] api_listen and run `gpueff serve` (README: \"Privacy: users read "
           "through the service\")")


def ask_service(query: SeffQuery, service: ServiceConfig) -> Answer:
    """The Answer from ``gpueff serve``'s API, authenticated with a MUNGE credential bound to this query."""
    from ..access.client import SEFF_PATH, Unreachable, api_url, post_signed

    if not api_url(service):
        raise CommandError(PRIVATE, EXIT_ERROR)
    body = json.dumps(query._asdict(), sort_keys=True).encode()
    try:
        reply = post_signed(service, SEFF_PATH, body, name="the seff-gpu service")
    except Unreachable as exc:
        raise CommandError(str(exc), EXIT_ERROR) from None
    if reply.status != 200:
        raise CommandError(f"cannot reach the seff-gpu service at {api_url(service)}: HTTP {reply.status}: "
                           f"{reply.reason()}", EXIT_ERROR)
    try:
        return Answer.from_json(json.loads(reply.body))
    except ValueError as exc:
        raise CommandError(f"cannot read the seff-gpu service's answer: {exc}", EXIT_ERROR) from None


if __name__ == "__main__":
    sys.exit(main())
