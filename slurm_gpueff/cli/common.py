"""What ``gpueff`` and ``seff-gpu`` share: their config, their error lines and exit status, the job database;
and ``gpueff``'s progress bar.

Stdlib-only at import time: every command module imports this while ``gpueff`` builds its parser, and
``gpueff hook prolog`` (run by slurmd on every job start) must load nothing heavy.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, NoReturn

from ..errors import GpueffError
from ..fmt import one_line

if TYPE_CHECKING:
    from sqlalchemy.engine import Engine

    from ..config import Config

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

CONFIG_HELP = "config file (default: $GPUEFF_CONFIG or /etc/slurm-gpueff/gpueff.toml)"
# How storage.ingest and storage.enrich word the error that stopped their run: the database unavailable,
# damaged or foreign (storage.writer.UNAVAILABLE). The commands make it their one line and exit 1.
STOPPED = "database unavailable ("
CONFIG_NOTE = "The config file is --config, else $GPUEFF_CONFIG, else /etc/slurm-gpueff/gpueff.toml."


class OneLineParser(argparse.ArgumentParser):
    """A usage error is one line, ``PROG: error: ...`` and exit 2, like every other error of the
    commands (cli/common.py), not argparse's usage block first; subcommands' parsers are of this class too
    (argparse makes them of their parent's). Line breaks typed into an argument are escaped."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


class UsageError(GpueffError):
    """The command line asks for something that cannot be done: exit 2."""

    exit_code = 2


class CommandError(GpueffError):
    """A failure with the exit status its command documents for it (``seff-gpu``'s 3 to 6)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def err(msg: str, prog: str = "gpueff") -> None:
    """One line on stderr, whatever the message holds (a path or a driver's text may hold a newline)."""
    print(one_line(f"{prog}: {msg.strip()}"), file=sys.stderr)


def run_command(prog: str, command: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run ``command(args)``: a GpueffError becomes one line on stderr and the error's exit status."""
    try:
        return int(command(args))
    except GpueffError as exc:
        err(str(exc), prog)
        return exc.exit_code
    except BrokenPipeError:  # `seff-gpu 123 | head`: stdout to /dev/null, so the exit flush cannot fail again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        return 130


def load_config(args: argparse.Namespace) -> Config:
    from ..config import load

    return load(args.config)


@contextmanager
def database(config: Config, create: bool = True, read_only: bool = False, checking: bool = False) -> Iterator[Engine]:
    """The job database for a ``with`` block (disposed of at its end), or a one-line error (exit 1) naming it
    without its password: also for a database error the block itself does not handle (the server down, a
    damaged or foreign file, a schema Alembic cannot migrate)."""
    import sqlite3

    from sqlalchemy import exc as sa_exc

    from ..storage.db import engine_for, first_line
    from ..storage.dburl import safe_url

    name = safe_url(config.paths.database)
    try:
        engine = engine_for(config.paths, create=create, read_only=read_only, checking=checking)
    except GpueffError as exc:
        raise GpueffError(f"cannot open the job database {name}: {exc}") from None
    except (sa_exc.SQLAlchemyError, OSError, ValueError) as exc:
        raise GpueffError(f"cannot open the job database {name}: {_one_line(exc)}") from None
    try:
        yield engine
    except (sa_exc.SQLAlchemyError, sqlite3.Error) as exc:
        raise GpueffError(f"job database {name}: {first_line(exc)}") from None
    except UnicodeDecodeError as exc:  # a damaged file's text column: SQLite hands over bytes that are not UTF-8
        raise GpueffError(f"job database {name} is damaged (text that is not UTF-8: {exc.reason}); "
                          "restore it from a backup") from None
    except Exception as exc:
        if type(exc).__module__.startswith("alembic"):  # alembic.util.CommandError and kin
            raise GpueffError(f"job database {name}: {_one_line(exc)}") from None
        raise
    finally:
        engine.dispose()


def _one_line(exc: BaseException) -> str:
    from ..storage.db import first_line

    return first_line(exc) if hasattr(exc, "orig") else (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def at_least_one(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise UsageError(f"{flag} must be at least 1")


def log_to_stderr(verbose: bool, name: str) -> None:
    """Log lines as journald shows them best; the scheduler's and Alembic's own chatter only with ``-v``
    (a start that migrates says so in one line of its own: storage.migrate)."""
    import logging  # here, not at the top: `gpueff hook prolog` does not pay for it

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s gpueff-{name} %(levelname)s %(message)s")
    if not verbose:
        for chatty in ("apscheduler", "alembic"):
            logging.getLogger(chatty).setLevel(logging.WARNING)


class ProgressBar:
    """A one-line progress bar on stderr, shown only on a terminal (cron and systemd logs stay clean). Call it
    with ``(done, total)``; ``close()`` ends the line."""

    WIDTH = 30

    def __init__(self, label: str, quiet: bool):
        self.label, self.shown = label, False
        self.enabled = not quiet and sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not (self.enabled and total):
            return
        filled = int(self.WIDTH * min(done, total) / total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (self.WIDTH - filled)}] {done}/{total}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
