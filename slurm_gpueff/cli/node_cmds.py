"""The commands that run on the GPU nodes: ``gpueff agent`` (NVML sampling) and ``gpueff hook`` (Slurm hooks).

``hook prolog|epilog`` imports nothing but the hook module, which loads its own config and never fails
the job: a failing Prolog drains the node, so even a stray argument there is not refused.
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from .common import UsageError, load_config, log_to_stderr

if TYPE_CHECKING:
    from .common import Subparsers


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    a = sub.add_parser("agent", parents=[common], help="run the NVML sampling agent (nvml backend)")
    a.add_argument("--once", action="store_true", help="sample once, write the state file and exit")
    a.add_argument("--energy-interval", type=float, metavar="S",
                   help="seconds between energy-counter reads (default 30; power is integrated in between)")
    a.add_argument("-v", "--verbose", action="store_true", help="debug logging")

    h = sub.add_parser("hook", parents=[common], help="run a Slurm hook, or install the hook scripts",
                       description="Run the Prolog/Epilog hook (always exits 0: a hook never hurts a job), "
                                   "or `hook install DIR` to copy the hook scripts into DIR.")
    h.add_argument("kind", choices=("prolog", "epilog", "install"))
    h.add_argument("dir", nargs="?", help="target directory (install only)")


def run(args: argparse.Namespace) -> int:
    if args.command == "agent":
        return _agent(args)
    if args.kind == "install":
        return _install(args.dir, args.config)
    from .. import hook  # the hook path: stdlib only

    hook.main(args.kind, args.config)  # arms its watchdog, writes the record, exits 0


def _agent(args: argparse.Namespace) -> int:
    interval = args.energy_interval
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise UsageError("--energy-interval must be a positive number of seconds")
    config = load_config(args)
    from ..collectors.agent_run import run_agent

    log_to_stderr(args.verbose, "agent")
    return run_agent(config, once=args.once, energy_interval_s=interval)


def _install(target: str | None, config_path: str | None) -> int:
    if not target:
        raise UsageError("hook install needs a target directory: gpueff hook install DIR")
    from ..hook_install import install_hooks

    # `gpueff --config PATH hook install DIR`: the scripts read PATH (slurmd passes no GPUEFF_CONFIG).
    for path in install_hooks(target, config_path=config_path):
        print(f"installed {path}")
    return 0
