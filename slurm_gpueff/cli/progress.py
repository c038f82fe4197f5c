"""A one-line progress bar on stderr, shown only on a terminal (cron and systemd logs stay clean)."""

from __future__ import annotations

import sys
from typing import Any


class ProgressBar:
    """Call it with ``(done, total)``; without a total it counts. ``close()`` ends the line."""

    def __init__(self, label: str, enabled: bool, width: int = 30, unit: str = "records"):
        self.label, self.enabled, self.width, self.unit, self.shown = label, enabled, width, unit, False

    def __call__(self, done: int, total: int | None = None, *_: Any, **__: Any) -> None:
        if not self.enabled:
            return
        if total:
            filled = int(self.width * min(done, total) / total)
            text = f"\r{self.label} [{'#' * filled}{'.' * (self.width - filled)}] {done}/{total}"
        else:
            text = f"\r{self.label} {done} {self.unit}"
        sys.stderr.write(text)
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
