"""``gpueff alerts run|log``: the idle-GPU policy over running jobs, and its audit.

``run`` is one pass of what ``gpueff serve`` does every ``[alerts] interval_s`` when ``[alerts] enabled``
(service/alerts.py): warning mails, and a cancel only where ``[alerts] cancel = true``; ``--dry-run``
decides and audits without mailing or cancelling. ``log`` prints the audit table, newest last.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from ..fmt import one_line, visible
from .common import at_least_one, database, load_config

if TYPE_CHECKING:
    from .common import Subparsers

TITLE = "idle-GPU alerts"
EXAMPLES: tuple[tuple[str, str], ...] = (  # `gpueff --help` shows them under TITLE
    ("alerts run --dry-run", "one pass, nothing mailed or cancelled"),
    ("alerts log", "what the passes decided and did"),
)


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    a = sub.add_parser("alerts", parents=[common], help="idle-GPU policy for running jobs: run a pass, show "
                       "the audit", description="The idle-GPU policy ([alerts] in the config): GPUs of running "
                       "jobs idle over a sliding window get their owner a warning, a second one, and, only "
                       "with [alerts] cancel = true, the job cancelled. Every decision is audited.")
    s = a.add_subparsers(dest="alerts_command", metavar="ACTION", required=True)
    r = s.add_parser("run", parents=[common], help="one pass now (as gpueff serve does on its schedule)")
    r.add_argument("--dry-run", action="store_true", help="decide and audit, but mail and cancel nothing")
    lg = s.add_parser("log", parents=[common], help="the audit: every decision and action, newest last")
    lg.add_argument("--job", type=int, metavar="ID", help="only this job (raw id)")
    lg.add_argument("--limit", type=int, default=50, metavar="N", help="the last N rows (default 50)")
    lg.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    config = load_config(args)
    if args.alerts_command == "log":
        at_least_one("--limit", args.limit)
    with database(config) as engine:
        if args.alerts_command == "run":
            from ..service.alerts import run_alerts

            res = run_alerts(engine, config, dry_run=True if args.dry_run else None)
            for line in res.actions:
                print(visible(one_line(line)))
            print(res)
            return 1 if res.errors else 0
        return _log(engine, args)


def _log(engine: object, args: argparse.Namespace) -> int:
    from sqlmodel import Session, col, select

    from ..fmt import iso
    from ..models import AlertLog

    stmt = select(AlertLog)
    if args.job is not None:
        stmt = stmt.where(AlertLog.job_id == args.job)
    with Session(engine) as session:  # type: ignore[arg-type]
        rows = list(session.exec(stmt.order_by(col(AlertLog.id).desc()).limit(args.limit)).all())[::-1]
    if args.json:
        print(json.dumps([{"at": iso(r.at), "cluster": r.cluster, "job_id": r.job_id, "run": r.run, "user": r.user,
                           "account": r.account, "action": r.action, "dry_run": r.dry_run, "detail": r.detail,
                           "outcome": r.outcome} for r in rows], indent=2))
        return 0
    if not rows:
        print("(no alert decisions yet)")
    for r in rows:
        dry = " [dry run]" if r.dry_run else ""
        print(visible(one_line(f"{r.at:%Y-%m-%d %H:%M:%S} UTC  job {r.job_id}  {r.user or '?'}  {r.action}{dry}: "
                               f"{r.outcome or ''}")))
        print(visible(one_line(f"    seen: {r.detail}")))
    return 0
