"""What the ``gpueff`` commands share: their config, their error line, the job database, their log format.

Stdlib-only at import time: every command module imports this while ``gpueff`` builds its parser, and
``gpueff hook prolog`` (run by slurmd on every job start) must load nothing heavy.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from ..errors import GpueffError

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..config import Config

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


class UsageError(GpueffError):
    """The command line asks for something that cannot be done: ``gpueff`` prints it and exits 2."""

    exit_code = 2


def err(msg: str) -> None:
    print(f"gpueff: {msg}", file=sys.stderr)


def load_config(args: argparse.Namespace) -> Config:
    """The config the command names (``--config``, else $GPUEFF_CONFIG, else the default path)."""
    from ..config import load

    return load(args.config)


def open_database(config: Config, create: bool = True) -> Engine:
    """The job database, or a one-line error (exit 1) that names it."""
    from ..storage.db import make_engine

    try:
        return make_engine(config.paths.database, create=create)
    except Exception as exc:
        raise GpueffError(f"cannot open the job database {config.paths.database}: {exc}") from None


def at_least_one(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{flag} must be at least 1")


def log_to_stderr(verbose: bool, name: str) -> None:
    """Log lines as journald shows them best; the scheduler's own chatter only with ``-v``."""
    import logging  # here, not at the top: `gpueff hook prolog` does not pay for it

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s gpueff-{name} %(levelname)s %(message)s")
    if not verbose:
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
