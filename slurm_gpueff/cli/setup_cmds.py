"""Trying and checking an installation: ``gpueff demo``, ``gpueff config check``, ``gpueff doctor`` and
``gpueff version``."""

from __future__ import annotations

import argparse
import json
import os
from typing import TYPE_CHECKING

from .common import UsageError, load_config

if TYPE_CHECKING:
    from ..config import Config
    from .common import Subparsers

TITLE = "trying and checking an installation"
EXAMPLES: tuple[tuple[str, str], ...] = (  # `gpueff --help` shows them under TITLE
    ("demo", "the product on a simulated cluster"),
    ("config check", "validate; print the effective values"),
    ("doctor --role node", "what a GPU node needs, PASS/WARN/FAIL"),
)


def add_parsers(sub: Subparsers, common: argparse.ArgumentParser) -> None:
    d = sub.add_parser("demo", help="run the product end to end on simulated GPUs")
    # Not shown: the demo writes and uses a config of its own (run() refuses --config with that reason).
    d.add_argument("--config", metavar="PATH", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    d.add_argument("--dir", metavar="DIR", help="where to build the demo cluster (default ./gpueff-demo); it is "
                   "kept afterwards, and the next demo in the same DIR replaces it")

    c = sub.add_parser("config", parents=[common], help="configuration tools")
    csub = c.add_subparsers(dest="config_command", metavar="ACTION", required=True)
    cc = csub.add_parser("check", parents=[common], help="validate the config and print the effective values")
    cc.add_argument("--json", action="store_true", help="print as JSON")

    dr = sub.add_parser("doctor", parents=[common], help="check what this host needs for its role (--role): "
                                                         "PASS/WARN/FAIL per line")
    dr.add_argument("--json", action="store_true", help="print as JSON")
    dr.add_argument("--role", choices=("all", "service", "node", "login"), default="all",
                    help="check what this host's role needs: service (ingest, database, /metrics, API), node "
                         "(GPUs, agent, Slurm hooks, spool), login (seff-gpu for users: interpreter, munge, API); "
                         "default all")

    sub.add_parser("version", help="print the version")


def run(args: argparse.Namespace) -> int:
    if args.command == "version":
        from .. import __version__

        print(f"slurm-gpueff {__version__}")
        return 0
    if args.command == "demo":
        if args.config:
            raise UsageError("the demo writes and uses a config of its own in its folder; --config does not apply")
        from . import demo

        return int(demo.run(args) or 0)
    config = load_config(args)
    if args.command == "doctor":
        from . import doctor

        return doctor.run(config, args.json, args.role)
    return _config_check(config, args.json)


def _config_check(config: Config, as_json: bool) -> int:
    refuse_non_folders(config)
    data = config.as_dict()
    if as_json:
        print(json.dumps({"source": config.source, "config": data}, indent=2))
        return 0
    print(f"# effective configuration: {config.source} (valid)")
    for section, values in data.items():
        print(f"\n[{section}]")
        for key, value in values.items():  # booleans and strings as TOML writes them, which is JSON's way
            print(f"{key} = {json.dumps(value) if isinstance(value, bool | str) else repr(value)}")
    return 0


def refuse_non_folders(config: Config) -> None:
    """The folders of ``[paths]`` that exist must be folders: a FIFO, a file or a socket where the spool should
    be reads as valid config and fails every ingest and hook. (One that does not exist yet is made when
    first needed.)"""
    import stat

    from ..errors import ConfigError

    for key in ("spool_dir", "state_dir"):
        path = getattr(config.paths, key)
        try:
            mode = os.stat(path).st_mode
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise ConfigError(f"{config.source}: paths.{key} = {path!r}: {exc.strerror or exc}") from None
        if not stat.S_ISDIR(mode):
            kind = ("a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else
                    "a file" if stat.S_ISREG(mode) else "not a folder")
            raise ConfigError(f"{config.source}: paths.{key} = {path!r} is {kind}, not a folder: point it at a "
                              "folder (or a path that does not exist yet)")
