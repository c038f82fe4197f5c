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
    """A module of related commands: it adds their parsers and runs any of them (returning the exit status);
    ``TITLE`` and ``EXAMPLES`` (command line without ``gpueff``, what it does) are its part of ``--help``."""

    TITLE: str
    EXAMPLES: tuple[tuple[str, str], ...]

    def add_parsers(self, sub: Subparsers, common: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace) -> int: ...


# The registry, in the order `gpueff --help` lists the commands: a job's data from the node to the mail,
# then the tools to try and check an installation.
GROUPS: tuple[CommandGroup, ...] = (node_cmds, service_cmds, slurm_cmds, report_cmds, alert_cmds, setup_cmds)
DESCRIPTION = ("slurm-gpueff administration: the commands below, for the GPU nodes,\n"
               "the service host and its admins; `gpueff COMMAND --help` gives a command's flags.")


def epilog() -> str:
    """The examples of ``--help``, each group's under its title, from the registry: a command that goes
    leaves no example behind (tests/test_gpueff_cli.py parses every one)."""
    width = max(len(line) for group in GROUPS for line, _ in group.EXAMPLES) + len("gpueff ")
    lines = ["examples:"]
    for group in GROUPS:
        lines.append(f"  {group.TITLE}:")
        lines += [f"    {'gpueff ' + line:<{width}}  # {what}" for line, what in group.EXAMPLES]
    return "\n".join([*lines, "", CONFIG_NOTE])


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # Accepted before or after the subcommand; SUPPRESS keeps a later default from hiding an earlier value.
    common.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help=CONFIG_HELP)
    p: argparse.ArgumentParser = OneLineParser(
        prog="gpueff", parents=[common], description=DESCRIPTION, epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
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
