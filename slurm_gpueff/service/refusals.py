"""How the API logs refused requests: at most one line a minute per (uid, reason), with a count of the rest.

Every request was one log line, so one user sending refused requests in a loop (no credential, a replayed one,
another user's job) wrote 35,000 lines a minute: the log filled, and the lines that mattered drowned. A
refusal is logged when its (uid, reason) logged nothing in the last :data:`WINDOW_S`; the same ones within
that window are counted instead, and when it closes one line says how many there were ("refused 34,999 more
times in the last 60 s: ..."), which opens a new window, so a steady flood is one line a minute. A window
with nothing counted closes silently and the next such refusal is logged at once.

A window's count is written by the first request of anyone after it closes (the API calls :meth:`Pace.due`
with every request), so a flood that stops is counted within about a minute at a service that is in use.

The API says which requests it refused (an HTTP error, or a seff-gpu answer that is no card) and who asked:
the uid munged named, or None before the service knows. The number of (uid, reason) pairs followed at once is
bounded: beyond :data:`MAX_KEYS` they share one count.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

WINDOW_S = 60.0
MAX_KEYS = 10_000

Key = tuple[int | None, str]  # (who asked, the refusal's line)


class Pace:
    """The refusals' log lines for a stream of requests (thread-safe); ``clock`` is monotonic seconds."""

    def __init__(self, window_s: float = WINDOW_S, max_keys: int = MAX_KEYS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.window_s, self.max_keys, self.clock = window_s, max_keys, clock
        self._lock = threading.Lock()
        # (uid, reason) -> [when its window opened, refusals held back since, the last line held back]; in the
        # order the windows opened (a renewed one moves to the end), so the closed ones are at the front
        self._open: dict[Key, list[float | int | str]] = {}

    def lines(self, key: Key | None, line: str) -> list[str]:
        """What to log now for a request described by ``line``: the counts of windows that closed (as
        :meth:`due`), then ``line`` itself unless ``key`` (a refusal's, or None for any other request) is
        within its window (then it is counted)."""
        out = self.due()
        if key is None:
            return [*out, line]
        with self._lock:
            if key not in self._open and len(self._open) >= self.max_keys:
                key = (None, "(refusals of more kinds than are followed one by one)")
            window = self._open.get(key)
            if window is None:
                self._open[key] = [self.clock(), 0, line]
                return [*out, line]
            window[1] = int(window[1]) + 1
            window[2] = line
        return out

    def due(self) -> list[str]:
        """One line for each window that closed with refusals held back, which opens the next one; the quiet
        ones are forgotten."""
        now = self.clock()
        out = []
        with self._lock:
            closed = []
            for key, (opened, _held, _line) in self._open.items():
                if now - float(opened) < self.window_s:
                    break
                closed.append(key)
            for key in closed:
                _opened, held, line = self._open.pop(key)
                if held:
                    out.append(f"refused {held} more time{'s' if held != 1 else ''} in the last "
                               f"{self.window_s:.0f} s, the last: {line}")
                    self._open[key] = [now, 0, line]
        return out
