"""``gpueff enrich`` and ``gpueff backfill``: join Slurm accounting (sacct) into the job database.

When sacct or the database fails the command exits 1 and nothing is lost: the next run retries.
"""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from .common import STOPPED, ProgressBar, UsageError, at_least_one, database, database_error, err, load_config

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..config import Config
    from ..slurm.sacct import SacctReader
    from .common import Subparsers

TITLE = "Slurm accounting"
EXAMPLES: tuple[tuple[str, str], ...] = (  # `gpueff --help` shows them under TITLE
    ("enrich", "complete the job rows from sacct now"),
    ("backfill --since now-7d", "GPU jobs of a week the hooks missed"),
)


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    e = sub.add_parser("enrich", parents=[common], help="complete job rows from Slurm accounting (sacct)",
                       description="Fill array/het ids, job name, QOS, submit time, final state and exit code "
                                   "from sacct into jobs not enriched yet. Safe to run any time; a sacct "
                                   "failure changes nothing.")
    e.add_argument("--since", metavar="DATE", help="only jobs that ended since DATE "
                   "(default: [sacct] enrich_window_days ago)")
    e.add_argument("--limit", type=int, metavar="N", help="at most N jobs")
    e.add_argument("--quiet", action="store_true", help="no progress bar and no summary unless errors")
    b = sub.add_parser("backfill", parents=[common], help="allocation-only records for GPU jobs without one",
                       description="Find jobs that held GPUs according to sacct but have no record from the "
                                   "hooks (node crash, hooks not installed yet, collector or spool lost) and "
                                   "record their allocation, with the reason.")
    b.add_argument("--since", metavar="DATE", required=True, help="start of the window (sacct -S)")
    b.add_argument("--until", metavar="DATE", help="end of the window (default: now minus [sacct] "
                   "backfill_grace_s, so records still in the spool are not pre-empted)")
    b.add_argument("--cluster", metavar="NAME", help="Slurm cluster to ask (sacct -M; default: the local one)")
    b.add_argument("--quiet", action="store_true", help="no progress bar and no summary unless errors")


def parse_date(text: str) -> float:
    """Epoch seconds from ``YYYY-MM-DD[THH:MM[:SS]]`` (local time, like sacct), ``now``, ``now-3d``/``-6h``/``-30m``."""
    s = text.strip()
    m = re.fullmatch(r"now(?:-(\d+)([dhm]))?", s, re.ASCII)
    if m:
        ago = int(m.group(1)) * {"d": 86400, "h": 3600, "m": 60}[m.group(2)] if m.group(1) else 0
        return time.time() - ago
    for fmt in ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%d %H:%M:%S"):
        try:
            return time.mktime(time.strptime(s, fmt))
        except ValueError:
            continue
    raise UsageError(f"invalid date {text!r}: expected YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] or now-2d")


def run(args: argparse.Namespace) -> int:
    since = parse_date(args.since) if args.since else None
    until = parse_date(args.until) if args.command == "backfill" and args.until else None
    if args.command == "enrich":
        at_least_one("--limit", args.limit)
    config = load_config(args)
    if not config.sacct.accounting:
        print(f"{args.command}: nothing to do: [sacct] accounting = false (this site keeps no Slurm accounting; "
              "what the Epilog saw is final)")
        return 0
    from ..slurm.sacct import SacctReader  # its SacctError reaches `gpueff` (exit 1): nothing was changed

    reader = SacctReader.from_config(config)
    bar = ProgressBar(args.command, args.quiet)
    with database(config) as engine:
        try:
            if args.command == "enrich":
                errors, summary = _enrich(engine, reader, config, since, args.limit, bar)
            else:
                errors, summary = _backfill(engine, reader, config, since or 0.0, until, args.cluster, bar)
        finally:
            bar.close()
    stopped = [e for e in errors if e.startswith(STOPPED)]
    for e in errors:
        if e not in stopped:
            err(e)
    if stopped:  # the database is down, damaged or foreign: one line, not a summary of nothing done
        from ..storage.dburl import safe_url

        raise database_error(config, f"job database {safe_url(config.paths.database)}: {stopped[0]}")
    if not args.quiet or errors:
        print(summary)
    return 1 if errors else 0


def _enrich(engine: Engine, reader: SacctReader, config: Config, since: float | None, limit: int | None,
            bar: ProgressBar) -> tuple[list[str], str]:
    """The errors and the summary line of one enrich run."""
    from ..slurm.commands import shard_counter
    from ..slurm.runner import SlurmRunner
    from ..storage.enrich import enrich_jobs

    if since is None:
        since = time.time() - config.sacct.enrich_window_days * 86400
    since_dt = datetime.fromtimestamp(since, UTC).replace(tzinfo=None)
    res = enrich_jobs(engine, reader, since=since_dt, limit=limit, progress=bar, settle_s=config.sacct.settle_s,
                      shard_counts=shard_counter(SlurmRunner.from_config(config)))
    return res.errors, (f"enriched {res.enriched} of {res.checked} job(s) checked; {res.not_final} not finished "
                        f"in sacct yet, {res.settling} ended less than {config.sacct.settle_s:g} s ago, "
                        f"{res.not_found} unknown to sacct (retried next run)")


def _backfill(engine: Engine, reader: SacctReader, config: Config, since: float, until: float | None,
              cluster: str | None, bar: ProgressBar) -> tuple[list[str], str]:
    """The errors and the summary line of one backfill run."""
    from ..storage.enrich import backfill_jobs

    if until is None:
        until = time.time() - config.sacct.backfill_grace_s
    if until <= since:
        raise UsageError("backfill: --until is not after --since (without --until the window ends "
                         f"[sacct] backfill_grace_s = {config.sacct.backfill_grace_s:g} s before now)")
    jobs = reader.window(since, until, cluster=cluster)
    # sacct lists jobs *active* in the window; keep those that ended inside it
    jobs = [j for j in jobs if j.end is None or since <= j.end <= until]
    res = backfill_jobs(engine, jobs, default_cluster=config.site.cluster, progress=bar)
    created = ""
    if res.created_ids:
        created = f" ({', '.join(res.created_ids[:20])}{' ...' if len(res.created_ids) > 20 else ''})"
    return res.errors, (f"backfill: {res.seen} job(s) in sacct; created {res.created} allocation-only record(s)"
                        f"{created}; {res.had_record} already recorded ({res.enriched} enriched now), "
                        f"{res.no_gpus} without GPUs, {res.not_final} not finished")
