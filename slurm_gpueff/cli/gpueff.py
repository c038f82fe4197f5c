"""``gpueff``: the admin command. Subcommands import their module only when chosen, so that
``gpueff hook prolog`` (run by slurmd on every job start) loads no database or analysis code.

    gpueff [--config PATH] agent [--once] [-v]       the NVML node agent (nvml backend)
    gpueff [--config PATH] hook prolog|epilog        the Slurm hooks (always exit 0)
    gpueff hook install DIR                          install the hook scripts into DIR
    gpueff [--config PATH] ingest [--limit N] [--quiet]   spool -> database
    gpueff demo [--dir DIR] [--keep]                 the whole product on simulated GPUs
    gpueff [--config PATH] config check [--json]     validate and print the effective config
    gpueff [--config PATH] enrich [--since DATE]    complete job rows from sacct (array ids, state, ...)
    gpueff [--config PATH] backfill --since DATE [--until DATE]   records for GPU jobs the hooks missed
    gpueff [--config PATH] doctor [--json]           what this node offers: NVML, GPM, MIG, DCGM, hooks, dirs, DB
    gpueff [--config PATH] report cards|monthly|retry|optout|status   mail efficiency cards and summaries
    gpueff [--config PATH] db upgrade|current        database schema (Alembic migrations)
    gpueff [--config PATH] serve                     the service: scheduler + Prometheus /metrics
    gpueff [--config PATH] forward [--once]          node: ship the spool to the central PostgreSQL
    gpueff [--config PATH] rollup [--full]           refresh the per-day/per-month rollups
    gpueff version

Exit status: 0 ok; 1 error; 2 bad usage or invalid config (the message names file, section and key).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

EPILOG = """\
examples:
  gpueff config check --config /etc/slurm-gpueff/gpueff.toml
  gpueff ingest                   # move finished-job records from the spool into the database
  gpueff agent                    # NVML sampling agent (run by systemd: etc/gpueff-agent.service)
  gpueff demo                     # simulated cluster: hooks, spool, ingest and seff-gpu cards
  gpueff hook epilog              # what slurmd runs as Epilog (usually via hooks/epilog)

The config file is --config, else $GPUEFF_CONFIG, else /etc/slurm-gpueff/gpueff.toml."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # Accepted before or after the subcommand; SUPPRESS keeps a later default from hiding an earlier value.
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS,
                        help="config file (default: $GPUEFF_CONFIG or /etc/slurm-gpueff/gpueff.toml)")
    p = argparse.ArgumentParser(prog="gpueff", parents=[common],
                                description="slurm-gpueff administration: node agent, Slurm hooks, ingest, "
                                            "demo and config check.",
                                epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    a = sub.add_parser("agent", parents=[common], help="run the NVML sampling agent (nvml backend)")
    a.add_argument("--once", action="store_true", help="sample once, write the state file and exit")
    a.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    h = sub.add_parser("hook", parents=[common], help="run a Slurm hook, or install the hook scripts",
                       description="Run the Prolog/Epilog hook (always exits 0: a hook never hurts a job), "
                                   "or `hook install DIR` to copy the hook scripts into DIR.")
    h.add_argument("kind", choices=("prolog", "epilog", "install"))
    h.add_argument("dir", nargs="?", help="target directory (install only)")

    i = sub.add_parser("ingest", parents=[common],
                       help="load finished-job records from the spool into the database")
    i.add_argument("--limit", type=int, metavar="N", help="ingest at most N records")
    i.add_argument("--workers", type=int, metavar="N",
                   help="no effect, accepted for existing scripts: ingest runs in one process")
    i.add_argument("--quiet", action="store_true", help="no progress bar and no summary unless errors")

    d = sub.add_parser("demo", parents=[common], help="run the product end to end on simulated GPUs")
    d.add_argument("--dir", metavar="DIR", help="where to build the demo cluster (default ./gpueff-demo)")
    d.add_argument("--keep", action="store_true", help="keep the demo folder afterwards")

    c = sub.add_parser("config", parents=[common], help="configuration tools")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    cc = csub.add_parser("check", parents=[common], help="validate the config and print the effective values")
    cc.add_argument("--json", action="store_true", help="print as JSON")

    from . import slurm_cmds  # enrich, backfill (issue 3): sacct -> job database

    slurm_cmds.add_parsers(sub, common)

    dr = sub.add_parser("doctor", parents=[common], help="check this node: NVML, GPM, MIG, DCGM, agent, Slurm "
                                                         "hooks, spool, database (PASS/WARN/FAIL per line)")
    dr.add_argument("--json", action="store_true", help="print as JSON")

    from . import report  # report cards|monthly|retry|optout|status (issue 5): mail and archive

    report.add_parsers(sub, common)

    from . import service_cmds  # db, serve, forward, rollup (issue 4): the service host and PostgreSQL

    service_cmds.add_parsers(sub, common)

    sub.add_parser("version", help="print the version")
    return p


def _err(msg: str) -> None:
    print(f"gpueff: {msg}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    config_path: str | None = getattr(args, "config", None)
    if args.command == "hook" and args.kind in ("prolog", "epilog"):
        from .. import hook  # the hook path: stdlib only, loads its own config and never fails the job

        hook.main(args.kind, config_path)  # arms the watchdog; always exits 0
    from ..errors import ConfigError, GpueffError

    try:
        return _dispatch(args, config_path)
    except BrokenPipeError:  # `gpueff config check | head`
        return 0
    except ConfigError as exc:
        _err(str(exc))
        return 2
    except GpueffError as exc:
        _err(str(exc))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


def _dispatch(args: argparse.Namespace, config_path: str | None) -> int:
    if args.command == "version":
        from .. import __version__

        print(f"slurm-gpueff {__version__}")
        return 0
    if args.command == "hook":  # install
        return _hook_install(args, config_path)
    if args.command == "demo":
        from .. import demo

        return int(demo.run(args) or 0)
    from ..config import load

    config = load(config_path)
    if args.command == "doctor":
        from .. import doctor

        return doctor.run(config, args.json)
    if args.command == "config":
        return _config_check(config, args.json)
    if args.command == "agent":
        import logging

        from ..collectors.agent import run_agent

        logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, stream=sys.stderr,
                            format="%(asctime)s gpueff-agent %(levelname)s %(message)s")
        return int(run_agent(config, once=args.once))
    if args.command in ("enrich", "backfill"):
        from . import slurm_cmds

        return slurm_cmds.run(args, config)
    if args.command == "ingest":
        return _ingest(config, args)
    if args.command in ("db", "serve", "forward", "rollup"):
        from . import service_cmds

        return service_cmds.run(args, config)
    if args.command == "report":
        from . import report

        return report.run(args, config)
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover - argparse guards this


def _hook_install(args: argparse.Namespace, config_path: str | None = None) -> int:
    if not args.dir:
        _err("hook install needs a target directory: gpueff hook install DIR")
        return 2
    from .. import hook

    # `gpueff --config PATH hook install DIR`: the scripts read PATH (slurmd passes no GPUEFF_CONFIG).
    for path in hook.install_hooks(args.dir, config_path=config_path):
        print(f"installed {path}")
    return 0


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    return repr(v)


def _config_check(config: Any, as_json: bool) -> int:
    data = config.as_dict()
    if as_json:
        print(json.dumps({"source": config.source, "config": data}, indent=2))
        return 0
    print(f"# effective configuration: {config.source} (valid)")
    for section, values in data.items():
        print(f"\n[{section}]")
        for key, value in values.items():
            print(f"{key} = {_toml_value(value)}")
    return 0


def _ingest(config: Any, args: argparse.Namespace) -> int:
    from ..storage.db import make_engine
    from ..storage.ingest import ingest_spool

    if args.limit is not None and args.limit < 1:
        _err("--limit must be at least 1")
        return 2
    if args.workers is not None and not 0 <= args.workers <= 64:
        _err("--workers must be 0 (automatic) to 64")
        return 2
    try:
        engine = make_engine(config.paths.database)
    except Exception as exc:
        _err(f"cannot open the job database {config.paths.database}: {exc}")
        return 1
    from ..summarize import summarize_pending
    from .progress import ProgressBar

    progress = ProgressBar("ingest", enabled=not args.quiet and sys.stderr.isatty())
    analysed = 0
    try:
        result = ingest_spool(engine, config.paths.spool_dir, limit=args.limit, progress=progress)
        try:  # the stored per-job summaries that rollups and reports aggregate
            analysed = summarize_pending(engine, config.analysis)
        except Exception as exc:  # the records are safely in the DB; the next run retries the summaries
            _err(f"ingested, but could not update job summaries (next run retries): {exc}")
    finally:
        progress.close()
        engine.dispose()
    for e in result.errors:
        _err(e)
    if not args.quiet or result.quarantined or result.failed:
        print(f"ingested {result.ingested}, quarantined {result.quarantined}, failed {result.failed}, "
              f"analysed {analysed} (spool {config.paths.spool_dir})")
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
