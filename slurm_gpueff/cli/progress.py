"""A one-line progress bar on stderr, shown only on a terminal (cron and systemd logs stay clean)."""

from __future__ import annotations

import sys

WIDTH = 30


class ProgressBar:
    """Call it with ``(done, total)``; ``close()`` ends the line."""

    def __init__(self, label: str, quiet: bool):
        self.label, self.shown = label, False
        self.enabled = not quiet and sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if not (self.enabled and total):
            return
        filled = int(WIDTH * min(done, total) / total)
        sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (WIDTH - filled)}] {done}/{total}")
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
