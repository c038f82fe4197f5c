"""How much of a job's window its figures cover, in one line for the card (docs/FIGURES.md "The job's window").

The nvml backend records, per GPU, the window its figures span, the part of it the agent measured and
how each end was read (collectors/window.py). Most jobs need no words: both ends read on the hooks'
request and nothing missing. Otherwise the card says what is not covered, and why, so that a figure over
41 of 45 seconds is not read as one over 45.
"""

from __future__ import annotations

from ..fmt import clock
from ..readmodel import Window


def describe(window: Window | None, window_s: float | None, measured_s: float | None) -> str | None:
    """"measured 41 of 45 s; agent down 13:20:05-13:20:10 (agent not running (killed or crashed))", the
    ends read late where they were, and a lost continuity; None when there is nothing to say."""
    if window is None:
        return None
    parts = []
    if window.broken is not None:
        parts.append(window.broken)
    gaps = window.gaps
    if gaps and window_s is not None and measured_s is not None:
        downs = "; ".join(f"{clock(a)}-{clock(b)} ({why})" for a, b, why in gaps[:3])
        more = f" and {len(gaps) - 3} more" if len(gaps) > 3 else ""
        parts.append(f"measured {measured_s:.0f} of {window_s:.0f} s; agent down {downs}{more}")
    for end, hook, off, exact in (("start", "Prolog", window.start_offset_s, window.start_exact),
                                  ("end", "Epilog", window.end_offset_s, window.end_exact)):
        if exact is False and off is not None and abs(off) >= 0.5:
            parts.append(f"job {end} read {abs(off):.1f} s {'before' if off > 0 else 'after'} the {hook} "
                         "(the agent took no reading on request)")
    return "; ".join(parts) or None
