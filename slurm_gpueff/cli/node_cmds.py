"""The commands that run on the GPU nodes: ``gpueff agent`` (NVML sampling), ``gpueff live`` (running jobs'
live records, once) and ``gpueff hook`` (Slurm hooks).

``hook prolog|epilog`` imports nothing but the hook module, which loads its own config and never fails
the job: a failing Prolog drains the node, so even a stray argument there is not refused.
"""

from __future__ import annotations

import argparse
import math
import sys
from typing import TYPE_CHECKING

from .common import UsageError, load_config, log_to_stderr

if TYPE_CHECKING:
    from .common import Subparsers

TITLE = "on a GPU node"
EXAMPLES: tuple[tuple[str, str], ...] = (  # `gpueff --help` shows them under TITLE
    ("agent", "NVML sampling (etc/gpueff-agent.service)"),
    ("hook install DIR", "write the Prolog/Epilog scripts"),
    ("hook epilog", "what slurmd runs as Epilog"),
)


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    a = sub.add_parser("agent", parents=[common], help="run the NVML sampling agent (nvml backend)")
    a.add_argument("--once", action="store_true", help="sample once, write the state file and exit")
    a.add_argument("--energy-interval", type=float, metavar="S",
                   help="seconds between energy-counter reads (default 30; power is integrated in between)")
    a.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    lv = sub.add_parser("live", parents=[common], help="write the running jobs' live records once",
                        description="Write a live record (the figures so far) into the spool for every job "
                                    "running on this node. The agent does this every agent.live_interval_s; "
                                    "this runs one pass, e.g. from a timer on a node without the agent.")
    lv.add_argument("-v", "--verbose", action="store_true", help="name each record written")

    h = sub.add_parser("hook", parents=[common], help="run a Slurm hook, or install the hook scripts",
                       description="Run the Prolog/Epilog hook (always exits 0: a hook never hurts a job), "
                                   "or `hook install DIR` to copy the hook scripts into DIR.")
    h.add_argument("kind", choices=("prolog", "epilog", "install"))
    h.add_argument("dir", nargs="?", help="target directory (install only)")
    h.add_argument("--force", action="store_true", help="install: replace existing prolog/epilog scripts in DIR "
                   "(without it they are left as they are, exit 2)")


def run(args: argparse.Namespace) -> int:
    if args.command == "agent":
        return _agent(args)
    if args.command == "live":
        return _live(args)
    if args.kind == "install":
        return _install(args.dir, args.config, args.force)
    from .. import hook  # the hook path: stdlib only

    hook.main(args.kind, args.config)  # arms its watchdog, writes the record, exits 0


def _agent(args: argparse.Namespace) -> int:
    interval = args.energy_interval
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise UsageError("--energy-interval must be a positive number of seconds")
    config = load_config(args)
    from .. import live
    from ..node.run import run_agent
    from ..seff.livecard import answerer

    log_to_stderr(args.verbose, "agent")
    # The agent's process, with what lies above the node's layer: live records and seff-gpu's live card.
    return run_agent(config, once=args.once, energy_interval_s=interval, live_records=live.publish,
                     live_card=answerer(config))


def _live(args: argparse.Namespace) -> int:
    config = load_config(args)
    from .. import live

    problems: list[str] = []
    paths = live.publish(config, log=problems.append)
    for p in problems:
        print(f"gpueff live: {p}", file=sys.stderr)
    if args.verbose:
        for path in paths:
            print(path)
    print(f"{len(paths)} live record(s) written to {config.paths.spool_dir}")
    return 0


def _install(target: str | None, config_path: str | None, force: bool) -> int:
    if not target:
        raise UsageError("hook install needs a target directory: gpueff hook install DIR")
    from .hook_install import install_hooks

    # `gpueff --config PATH hook install DIR`: the scripts read PATH (slurmd passes no GPUEFF_CONFIG).
    for path in install_hooks(target, config_path=config_path, force=force):
        print(f"installed {path}")
    return 0
