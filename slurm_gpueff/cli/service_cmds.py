"""The service-side commands (issue 4):

    gpueff [--config PATH] db upgrade|current      Alembic migrations of the job database
    gpueff [--config PATH] serve [-v]              scheduler (ingest, enrich, rollups, retention, reports) + /metrics
    gpueff [--config PATH] forward [--once] [-v]   node: ship the spool to the central PostgreSQL
    gpueff [--config PATH] rollup [--full]         refresh the per-day/per-month rollups now
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Any

COMMANDS = ("db", "serve", "forward", "rollup")


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    db = sub.add_parser("db", parents=[common], help="database schema: upgrade (migrate) or show the revision",
                        description="Alembic migrations. SQLite files are upgraded automatically when opened for "
                                    "writing; a PostgreSQL database only by `gpueff db upgrade`.")
    db.add_argument("action", choices=("upgrade", "current"))
    db.add_argument("--revision", default="head", help="target revision for upgrade (default: head)")
    s = sub.add_parser("serve", parents=[common], help="the service: scheduled ingest, enrichment, rollups, "
                       "retention and reports, and Prometheus /metrics (until SIGTERM)")
    s.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    f = sub.add_parser("forward", parents=[common], help="node side: ship spooled records to the central "
                       "database (PostgreSQL); they stay in the spool until committed")
    f.add_argument("--once", action="store_true", help="one pass, then exit (status 1 if records were left)")
    f.add_argument("--batch", type=int, metavar="N", help="records per transaction (default 200)")
    f.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    r = sub.add_parser("rollup", parents=[common], help="refresh the per-day/per-month usage rollups now")
    r.add_argument("--full", action="store_true", help="recompute every month, not only changed ones")


def _log(verbose: bool, name: str) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s gpueff-{name} %(levelname)s %(message)s")
    if not verbose:
        logging.getLogger("apscheduler").setLevel(logging.WARNING)


def run(args: argparse.Namespace, config: Any) -> int:
    if args.command == "db":
        return _db(args, config)
    if args.command == "serve":
        from ..service.scheduler import serve

        _log(args.verbose, "serve")
        return serve(config)
    if args.command == "forward":
        from ..service.forward import ForwardError, run_forwarder

        _log(args.verbose, "forward")
        import signal
        import threading

        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        try:
            return run_forwarder(config, once=args.once, stop=stop, batch=args.batch)
        except ForwardError as exc:
            print(f"gpueff: {exc}", file=sys.stderr)
            return 2
    if args.command == "rollup":
        from ..storage.db import make_engine
        from ..storage.rollups import refresh

        engine = make_engine(config.paths.database)
        try:
            res = refresh(engine, full=args.full)
        finally:
            engine.dispose()
        months = ", ".join(m.strftime("%Y-%m") for m in res.months)
        print(f"rollups refreshed: {months} ({res.rows} rows, {res.seconds:.2f} s)")
        return 0
    raise AssertionError(args.command)  # pragma: no cover


def _db(args: argparse.Namespace, config: Any) -> int:
    from ..storage import migrate
    from ..storage.db import make_engine

    engine = make_engine(config.paths.database, create=False)
    url = engine.url.render_as_string(hide_password=True)
    try:
        if args.action == "upgrade":
            before, after = migrate.upgrade(engine, args.revision)
            print(f"{url}: {before or '(empty)'} -> {after}" if before != after else f"{url}: already at {after}")
            return 0
        with engine.connect() as conn:
            rev = migrate.current(conn)
        head = migrate.head()
        state = "up to date" if rev == head else f"needs `gpueff db upgrade` (newest is {head})"
        print(f"{url}: {rev or '(no schema)'} ({state})")
        return 0 if rev == head else 1
    finally:
        engine.dispose()
