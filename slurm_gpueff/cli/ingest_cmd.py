"""``gpueff ingest [--limit N] [--workers N] [--quiet]``: finished-job records from the spool into the database.

Exit status: 0 ok; 1 a record could not be stored (it stays in the spool for the next run) or the
database is unreachable; 2 bad usage or config.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from .common import UsageError, at_least_one, err, load_config, open_database

if TYPE_CHECKING:
    from .common import Subparsers


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    i = sub.add_parser("ingest", parents=[common],
                       help="load finished-job records from the spool into the database")
    i.add_argument("--limit", type=int, metavar="N", help="ingest at most N records")
    i.add_argument("--workers", type=int, metavar="N",
                   help="processes for a backlog of 500+ records (default: [service] ingest_workers; "
                        "0 = automatic: half the CPUs, 2-8, on SQLite; 3/4, 2-12, on PostgreSQL)")
    i.add_argument("--quiet", action="store_true", help="no progress bar and no summary unless errors")


def run(args: argparse.Namespace) -> int:
    at_least_one("--limit", args.limit)
    if args.workers is not None and not 0 <= args.workers <= 64:
        raise UsageError("--workers must be 0 (automatic) to 64")
    config = load_config(args)
    engine = open_database(config)
    from ..storage.ingest import ingest_spool, worker_count
    from ..summarize import summarize_pending
    from .progress import ProgressBar

    progress = ProgressBar("ingest", enabled=not args.quiet and sys.stderr.isatty())
    analysed = 0
    try:
        workers = worker_count(config.service.ingest_workers if args.workers is None else args.workers,
                               engine.dialect.name)
        result = ingest_spool(engine, config.paths.spool_dir, limit=args.limit, progress=progress, workers=workers)
        try:  # the stored per-job summaries that rollups and reports aggregate
            analysed = summarize_pending(engine, config.analysis)
        except Exception as exc:  # the records are safely in the DB; the next run retries the summaries
            err(f"ingested, but could not update job summaries (next run retries): {exc}")
    finally:
        progress.close()
        engine.dispose()
    for e in result.errors:
        err(e)
    if not args.quiet or result.quarantined or result.failed:
        print(f"ingested {result.ingested}, quarantined {result.quarantined}, failed {result.failed}, "
              f"analysed {analysed} (spool {config.paths.spool_dir})")
    return 1 if result.failed else 0
