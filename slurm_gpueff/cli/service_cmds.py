"""The database side: ``gpueff ingest``, ``gpueff db`` (the schema), ``gpueff serve`` (the service),
``gpueff forward`` (a node's spool to the service) and ``gpueff rollup``."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from ..errors import GpueffError
from .common import (
    STOPPED,
    ProgressBar,
    UsageError,
    at_least_one,
    database,
    database_error,
    err,
    load_config,
    log_to_stderr,
)

if TYPE_CHECKING:
    from ..config import Config
    from .common import Subparsers

TITLE = "the service and its database"
EXAMPLES: tuple[tuple[str, str], ...] = (  # `gpueff --help` shows them under TITLE
    ("serve", "the service (etc/gpueff-serve.service)"),
    ("forward", "push the node's spool to the service"),
    ("db upgrade", "migrate the schema (PostgreSQL)"),
    ("ingest", "without serve: spool into the database"),
)


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    i = sub.add_parser("ingest", parents=[common],
                       help="load finished-job records from the spool into the database")
    i.add_argument("--limit", type=int, metavar="N", help="ingest at most N records")
    i.add_argument("--quiet", action="store_true", help="no progress bar and no summary unless errors")
    db = sub.add_parser("db", parents=[common], help="the database: upgrade (migrate), show the revision, or "
                        "check its integrity",
                        description="Alembic migrations. SQLite files are upgraded automatically when opened for "
                                    "writing; a PostgreSQL database only by `gpueff db upgrade`. `db check` "
                                    "checks the whole file (SQLite's quick_check) and sets or clears the damage "
                                    "mark that stops every command (gpueff serve checks at start and daily). "
                                    "`db copy --from SRC` copies every table of the database SRC (a SQLite file "
                                    "or URL) into the configured one, which must be empty (its schema is made "
                                    "if it has none), and compares the row counts (exit 1 if they differ).")
    db.add_argument("action", choices=("upgrade", "current", "check", "copy"))
    db.add_argument("--revision", help="target revision for upgrade (default: head)")
    db.add_argument("--limit-s", type=float, default=0.0, metavar="SECONDS",
                    help="db check: stop after this long (default 0: no limit)")
    db.add_argument("--from", dest="source", metavar="SRC",
                    help="db copy: the database to copy from (a SQLite file's path or a database URL)")
    db.add_argument("--force", action="store_true",
                    help="db copy: delete what the configured database holds first (else it must be empty)")
    db.add_argument("--quiet", action="store_true", help="db copy: no progress bar")
    s = sub.add_parser("serve", parents=[common], help="the service: scheduled ingest, enrichment, rollups, "
                       "retention, reports and alerts; the API ([service] api_listen) and Prometheus /metrics "
                       "(until SIGTERM)")
    s.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    f = sub.add_parser("forward", parents=[common], help="node side: push spooled records to gpueff serve "
                       "([service] api_url), signed by MUNGE; each stays in the spool until acknowledged")
    f.add_argument("--once", action="store_true", help="one pass, then exit (status 1 if records were left)")
    f.add_argument("--batch", type=int, metavar="N", help="records per push (default 500)")
    f.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    r = sub.add_parser("rollup", parents=[common], help="refresh the per-day/per-month usage rollups now")
    r.add_argument("--full", action="store_true", help="recompute every month, not only changed ones")


def run(args: argparse.Namespace) -> int:
    if args.command == "db" and args.action != "upgrade" and args.revision:
        raise UsageError(f"db {args.action}: --revision applies to `db upgrade` only")
    if args.command == "db" and (args.limit_s < 0 or (args.limit_s and args.action != "check")):
        raise UsageError("--limit-s: `db check` only, 0 (no limit) or more seconds")
    if args.command == "db" and (args.action == "copy") != (args.source is not None):
        raise UsageError("db copy needs --from SRC (the database to copy), and --from is for `db copy` only")
    if args.command == "db" and args.action != "copy" and (args.force or args.quiet):
        raise UsageError("--force and --quiet are for `db copy` only")
    if args.command == "ingest":
        at_least_one("--limit", args.limit)
    if args.command == "forward":
        at_least_one("--batch", args.batch)
    config = load_config(args)
    if args.command == "ingest":
        return _ingest(config, args.limit, args.quiet)
    if args.command == "db" and args.action == "check":
        return _db_check(config, args.limit_s)
    if args.command == "db" and args.action == "copy":
        from .db_copy import db_copy

        return db_copy(config, args.source, args.force, args.quiet)
    if args.command == "db":
        return _db(config, args.action, args.revision or "head")
    if args.command == "serve":
        from ..service.scheduler import serve

        log_to_stderr(args.verbose, "serve")
        return serve(config)
    if args.command == "forward":
        return _forward(config, args.once, args.batch, args.verbose)
    return _rollup(config, args.full)


def _ingest(config: Config, limit: int | None, quiet: bool) -> int:
    import logging

    from ..access.spool_trust import configured_trust
    from ..service.summarize import summarize_pending
    from ..storage.db import first_line
    from ..storage.ingest import ingest_spool

    if not logging.getLogger().handlers:  # its log lines are for `gpueff serve`'s journal; here the result
        logging.getLogger("slurm_gpueff.storage").addHandler(logging.NullHandler())  # says it, once
    analysed = 0
    with database(config) as engine:
        progress = ProgressBar("ingest", quiet)
        try:
            result = ingest_spool(engine, config.paths.spool_dir, limit=limit, progress=progress,
                                  trust=configured_trust(config))
            stopped = [e for e in result.errors if e.startswith(STOPPED)]
            if not stopped:
                try:  # the stored per-job summaries that rollups and reports aggregate
                    analysed = summarize_pending(engine, config.analysis)
                except Exception as exc:  # the records are safely in the DB; the next run retries the summaries
                    err(f"ingested, but could not update job summaries (next run retries): {first_line(exc)}")
        finally:
            progress.close()
    for e in result.errors:
        if e not in stopped:
            err(e)
    if stopped:  # the database is down, damaged or foreign: one line, nothing else was tried
        from ..storage.dburl import safe_url

        raise database_error(config, f"job database {safe_url(config.paths.database)}: {stopped[0]}")
    if not quiet or result.quarantined or result.failed:
        print(f"ingested {result.ingested}, quarantined {result.quarantined}, failed {result.failed}, "
              f"analysed {analysed} (spool {config.paths.spool_dir})")
    return 1 if result.failed else 0


def _forward(config: Config, once: bool, batch: int | None, verbose: bool) -> int:
    import signal
    import threading

    from ..node.push import run_forwarder

    log_to_stderr(verbose, "forward")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    return run_forwarder(config, once=once, stop=stop, batch=batch)


def _rollup(config: Config, full: bool) -> int:
    from ..storage.rollups import refresh

    with database(config) as engine:
        res = refresh(engine, full=full)
    months = ", ".join(m.strftime("%Y-%m") for m in res.months)
    print(f"rollups refreshed: {months} ({res.rows} rows, {res.seconds:.2f} s)")
    return 0


def _db_file_exists(path: str) -> bool:
    """Whether the SQLite file is there; a folder on the way closed to us is said as such, not as "missing"."""
    try:
        os.stat(path)
    except PermissionError:
        raise GpueffError(f"job database {path}: permission denied (it is private to the service account; "
                          "run this as that account or root)") from None
    except OSError:
        return False
    return True


def _db_check(config: Config, limit_s: float) -> int:
    """Check the whole database now and leave (or take away) SQLite's damage mark: after a restore, or to
    see for oneself what the service's daily check found. Exit 0 sound, 1 damaged or not finished."""
    from ..storage import integrity
    from ..storage.db import check_engine
    from ..storage.dburl import database_url, safe_url, sqlite_file

    path = sqlite_file(database_url(config.paths.database))
    name = safe_url(config.paths.database)
    if path and not _db_file_exists(path):
        raise GpueffError(f"job database {path} does not exist (yet): nothing to check")
    marked = path is not None and os.path.exists(integrity.mark_of(path))
    with database(config, create=False, read_only=not path, checking=True) as engine:
        state, detail = check_engine(engine, limit_s or 1e9)
    if path:
        try:
            integrity.record(path, state, detail)
        except OSError as exc:
            raise GpueffError(f"job database {path} checked {state} ({detail[:200]}), but its damage mark "
                              f"cannot be {'written' if state == 'damaged' else 'removed'}: {exc.strerror or exc} "
                              "(run this as the service account or root)") from None
    if state == "ok":
        print(f"{name}: sound ({detail})" + ("; its damage mark is removed" if marked else ""))
        return 0
    if state == "damaged":
        print(f"{name}: DAMAGED ({detail[:300]}): restore it from a backup" +
              ("; every command stops on it until then" if path else ""))
        return 1
    print(f"{name}: not finished ({detail}); nothing changed")
    return 1


def _db(config: Config, action: str, revision: str) -> int:
    """Show or upgrade the schema; a SQLite file is checked first (``PRAGMA quick_check``): neither says
    "up to date" of, nor migrates, a damaged file, and another program's database is refused."""
    from ..storage import migrate
    from ..storage.db import create_private
    from ..storage.dburl import database_url, sqlite_file
    from ..storage.integrity import check

    if action == "upgrade" and not migrate.known(revision):
        raise UsageError(f"db upgrade: unknown revision {revision!r} (the newest is {migrate.head()})")
    path = sqlite_file(database_url(config.paths.database))
    if path and not _db_file_exists(path):
        if action == "current":
            raise GpueffError(f"job database {path} does not exist (yet): `gpueff ingest` or `gpueff db upgrade` "
                              "creates it")
        create_private(path)
    with database(config, create=False) as engine:
        url = engine.url.render_as_string(hide_password=True)
        try:
            with engine.connect() as conn:
                if path:
                    state, detail = check(conn, 120.0)
                    if state == "damaged":
                        raise GpueffError(f"job database {url} is damaged ({detail}): restore it from a backup "
                                          "(or move it away and re-ingest)")
                migrate.refuse_foreign(conn)
                rev = migrate.current(conn)
            if action == "upgrade":
                before, after = migrate.upgrade(engine, revision)
                print(f"{url}: {before or '(empty)'} -> {after}" if before != after else f"{url}: already at {after}")
                return 0
        except migrate.SchemaError as exc:
            raise GpueffError(f"job database {url}: {exc}") from None
    head = migrate.head()
    state = "up to date" if rev == head else f"needs `gpueff db upgrade` (newest is {head})"
    if rev and rev != head and not migrate.known(rev):
        state = f"unknown to this version of slurm-gpueff (newest is {head}): a newer version's, or not ours"
    print(f"{url}: {rev or '(no schema)'} ({state})")
    return 0 if rev == head else 1
