"""``seff-gpu -u USER [-A ACCOUNT] [-S START] [-E END] [--json]``: one line per job, with totals.

Reads only the per-job summary columns (written at ingest by slurm_gpueff.summarize), so a month of a
user's jobs is one indexed query. Times are local (like sacct) and select jobs by their end time;
defaults: the last 7 days up to now.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from ..errors import GpueffError
from .common import CommandError, UsageError
from .seff import EXIT_DENIED

if TYPE_CHECKING:
    from ..config import Config

DEFAULT_DAYS = 7


def parse_time(text: str) -> datetime:
    """``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM[:SS]`` in local time -> naive UTC (how the DB stores times)."""
    try:
        local = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"bad time {text!r}: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]") from None
    if local.tzinfo is None:
        local = local.astimezone()  # interpret as this host's local time
    return local.astimezone(UTC).replace(tzinfo=None)


def run(args: argparse.Namespace, config: Config) -> int:
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from ..fmt import iso, utc
    from ..models import utcnow
    from ..render.jobs_table import as_json, render
    from ..storage.db import first_line, make_engine
    from ..storage.queries import list_jobs

    end = parse_time(args.end) if args.end else utcnow()
    start = parse_time(args.start) if args.start else end - timedelta(days=DEFAULT_DAYS)
    if start >= end:
        raise UsageError("-S/--starttime must be before -E/--endtime")
    user = args.user
    from ..privacy import current_user, sees_everything  # like sacct: non-admins see only their own jobs

    uid, name = current_user()
    if not sees_everything(config.privacy, uid, name):
        if user is None:
            user = name
        elif user != name:
            raise CommandError(f"you may only list your own jobs (user {name}); [privacy] in the config",
                               EXIT_DENIED)
    try:
        engine = make_engine(config.paths.database, create=False)
        with Session(engine) as session:
            jobs = list_jobs(session, user=user, account=args.account, start=start, end=end, cluster=args.cluster)
        engine.dispose()
    except SQLAlchemyError as exc:
        raise GpueffError(f"cannot read the job database: {first_line(exc)}") from None
    query = {"user": user, "account": args.account, "cluster": args.cluster,
             "start_utc": iso(start), "end_utc": iso(end)}
    if args.json:
        print(json.dumps(as_json(jobs, query), indent=2))
        return 0
    who = " ".join(f"{k} {v}" for k, v in (("user", user), ("account", args.account)) if v) or "all users"
    print(f"GPU jobs of {who} that ended {utc(start)} to {utc(end)}")
    if not jobs:
        print("(none)")
        return 0
    print(render(jobs))
    return 0
