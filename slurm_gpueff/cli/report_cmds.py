"""``gpueff report cards|monthly|retry|optout|status``: per-job efficiency cards and monthly summaries.

``--dry-run`` writes each message (``.eml``, ``.html``, ``.txt``, chart) under ``<reports.dir>/dry-run/``
instead of sending it; a dry run never blocks a later real send. A message that fails is kept for retry
and the command exits 1.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from .common import UsageError, at_least_one, database, load_config

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..config import Config
    from ..reports.runner import RunResult
    from .common import Subparsers

TITLE = "reports by mail"
EXAMPLES: tuple[tuple[str, str], ...] = (  # `gpueff --help` shows them under TITLE
    ("report monthly --dry-run", "last month's summaries, into files"),
    ("report cards", "mail the cards of jobs just ended"),
)


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    r = sub.add_parser("report", parents=[common], help="mail per-job efficiency cards and monthly summaries",
                       description="Per-job GPU efficiency cards for job owners and monthly GPU-hour waste "
                                   "summaries for research leads ([leads]), by SMTP ([mail]) with a sent-log in "
                                   "the database; every message is archived under reports.dir.")
    rs = r.add_subparsers(dest="report_command", metavar="ACTION", required=True)
    c = rs.add_parser("cards", parents=[common], help="send the cards of jobs that ended recently")
    c.add_argument("--dry-run", action="store_true", help="write the messages to files instead of sending")
    c.add_argument("--limit", type=int, metavar="N", help="at most N cards this run")
    m = rs.add_parser("monthly", parents=[common], help="send monthly GPU-hour summaries to leads and admins")
    m.add_argument("--month", metavar="YYYY-MM", help="the month (default: last month, UTC)")
    m.add_argument("--account", metavar="A", help="only this account's summary (default: every account, to "
                   "the users [leads] names for it, else to its Slurm coordinators with "
                   "reports.coordinators_as_leads; plus the site-wide one for reports.admins)")
    m.add_argument("--site", action="store_true", help="with --account: also the site-wide summary")
    m.add_argument("--dry-run", action="store_true", help="write the messages to files instead of sending")
    rs.add_parser("retry", parents=[common], help="re-send failed messages whose next try is due")
    o = rs.add_parser("optout", parents=[common], help="stop (or, with --undo, restart) cards for users")
    o.add_argument("users", nargs="*", metavar="USER")
    o.add_argument("--undo", action="store_true", help="opt the users back in")
    o.add_argument("--list", action="store_true", help="list the users who opted out")
    rs.add_parser("status", parents=[common], help="count the sent-log's messages by kind and status")


def _check(args: argparse.Namespace) -> None:
    """Refuse flags that would otherwise be silently ignored."""
    cmd = args.report_command
    if cmd == "cards":
        at_least_one("--limit", args.limit)
    elif cmd == "monthly":
        if args.site and not args.account:
            raise UsageError("report monthly: --site goes with --account (without --account every summary "
                             "is sent, the site-wide one included)")
        if args.month:
            from ..reports.monthly import month_bounds

            try:
                month_bounds(args.month)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    elif cmd == "optout":
        if args.list and (args.users or args.undo):
            raise UsageError("report optout: --list takes no USER and no --undo")
        if args.undo and not args.users:
            raise UsageError("report optout: --undo needs the USERs to opt back in")


def run(args: argparse.Namespace) -> int:
    _check(args)
    config = load_config(args)
    with database(config) as engine:
        if args.report_command in ("optout", "status"):
            _sentlog(args, config, engine)
            return 0
        result = _send(args, config, engine)
    for line in result.lines:
        print(line)
    print(result)
    return 1 if result.failed else 0


def _send(args: argparse.Namespace, config: Config, engine: Engine) -> RunResult:
    from ..reports import runner

    if args.report_command == "cards":
        return runner.send_cards(config, engine, dry_run=args.dry_run or None, limit=args.limit)
    if args.report_command == "monthly":
        return runner.send_monthly(config, engine, month=args.month, account=args.account,
                                   site=True if args.site else None, dry_run=args.dry_run or None)
    return runner.retry_failed(config, engine)


def _sentlog(args: argparse.Namespace, config: Config, engine: Engine) -> None:
    """``optout`` and ``status``: what the sent-log holds, or a change to who gets no cards."""
    from sqlmodel import Session

    from ..reports import sentlog

    with Session(engine) as session:
        if args.report_command == "status":
            counts = sentlog.status_counts(session)
            if not counts:
                print("no reports yet")
            for (kind, status), n in sorted(counts.items()):
                print(f"{kind:8} {status:10} {n}")
        elif not args.users:  # `optout` and `optout --list`
            for user in sorted(sentlog.opted_out(session, config.reports.optout_file)):
                print(user)
        else:
            changed = sentlog.set_optout(session, args.users, not args.undo)
            verb = "opted back in" if args.undo else "opted out"
            print(f"{verb}: {', '.join(changed) if changed else 'nothing changed'}")
