"""``gpueff``: the admin command, built from one registry of command groups.

Each group's docstring names its commands (``gpueff COMMAND --help`` lists their flags); adding a command
means adding it to a group, nothing here. The groups import their heavy modules only
when one of their commands runs, so that ``gpueff hook prolog`` (run by slurmd on every job start) loads
no database or analysis code.

Exit status: 0 ok; 1 error; 2 bad usage or invalid config (the message names file, section and key).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from . import alert_cmds, node_cmds, report_cmds, service_cmds, setup_cmds, slurm_cmds
from .common import CONFIG_HELP, CONFIG_NOTE, OneLineParser, run_command

if TYPE_CHECKING:
    from .common import Subparsers


class CommandGroup(Protocol):
    """A module of related commands: it adds their parsers and runs any of them (returning the exit status)."""

    def add_parsers(self, sub: Subparsers, common: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# The registry, in the order `gpueff --help` lists the commands: a job's data from the node to the mail,
# then the tools to try and check an installation.
GROUPS: tuple[CommandGroup, ...] = (node_cmds, service_cmds, slurm_cmds, report_cmds, alert_cmds, setup_cmds)

EPILOG = """\
examples:
  gpueff config check --config /etc/slurm-gpueff/gpueff.toml
  gpueff ingest                   # move finished-job records from the spool into the database
  gpueff agent                    # NVML sampling agent (run by systemd: etc/gpueff-agent.service)
  gpueff demo                     # simulated cluster: hooks, spool, ingest and seff-gpu cards
  gpueff hook epilog              # what slurmd runs as Epilog (usually via hooks/epilog)

""" + CONFIG_NOTE


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # Accepted before or after the subcommand; SUPPRESS keeps a later default from hiding an earlier value.
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help=CONFIG_HELP)
    p: argparse.ArgumentParser = OneLineParser(
        prog="gpueff", parents=[common], description="slurm-gpueff administration: node agent, Slurm hooks, "
        "ingest, demo and config check.", epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for group in GROUPS:
        known = set(sub.choices)
        group.add_parsers(sub, common)
        for name in sub.choices.keys() - known:
            sub.choices[name].set_defaults(run=group.run)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.config = getattr(args, "config", None)  # SUPPRESS above: absent unless given
    return run_command("gpueff", args.run, args)


if __name__ == "__main__":
    sys.exit(main())
