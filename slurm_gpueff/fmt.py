"""How every figure is printed: one function per quantity, so a figure reads the same on the terminal card,
in the jobs table, in verdict texts, in mail cards and in monthly summaries (rules: docs/FIGURES.md, "How
figures are printed").

Two promises hold for all of them: a measured value above zero never prints as zero (a user who sees
"0.0%" stops looking), and nothing prints in scientific notation. Unknown (None) prints "n/a"; the caller
adds the reason.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Protocol

NA = "n/a"
GiB = 1024**3
CURRENCY_SYMBOLS = {"EUR": "\u20ac", "USD": "$", "GBP": "\u00a3", "CHF": "CHF\u00a0", "JPY": "\u00a5"}


def _decimal(v: float) -> str:
    """One decimal; a positive value that would print as 0.0 gets two significant digits instead."""
    if 0 < v < 0.1:
        return f"{v:.{1 - math.floor(math.log10(v))}f}".rstrip("0").rstrip(".")
    return f"{v:.1f}"


# What must never reach a terminal, a page or a mail as itself: C0 and C1 control characters (ESC starts a
# terminal escape sequence, BEL rings), DEL, the line and paragraph separators, and the bidirectional
# controls that make text read in another order than it is stored. Text from records is untrusted.
UNSEEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """``text`` with every :data:`UNSEEN` character written as its escape (``\\u001b``), line breaks and tabs
    kept: what seff-gpu prints and writes, whatever a record held."""
    return UNSEEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


LINE_BREAKS = re.compile("[\r\n\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")  # every one str.splitlines() breaks at


def one_line(text: str) -> str:
    """``text`` as one line, whatever it holds (a configured path, a driver's message or a query's value may
    hold a line break): every line break escaped (``\\n``, ``\\r``, ``\\u000c``...), so an error stays one
    line in a terminal, in a log and for a program that splits it into lines."""
    return LINE_BREAKS.sub(lambda m: {"\r": "\\r", "\n": "\\n"}.get(m.group(), f"\\u{ord(m.group()):04x}"), text)


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 sample``, ``2 samples``: a count with its noun."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"


def pct(fraction: float | None) -> str:
    """A fraction in [0, 1] as a percentage: "42.0%", "0.8%", "0.05%", "0.0%"."""
    return NA if fraction is None else _decimal(100.0 * fraction) + "%"


def gpu_hours(h: float | None) -> str:
    """GPU-hours with fixed decimals by magnitude: "1,234", "12.00", "0.021", "<0.001", "0.000"."""
    if h is None:
        return NA
    if round(h, 2) >= 100:
        return f"{h:,.0f}"
    if round(h, 3) >= 1:
        return f"{h:.2f}"
    if h > 0 and round(h, 3) == 0:
        return "<0.001"
    return f"{h:.3f}"


def gib(n: int | float | None) -> str:
    """Bytes as GiB without the unit (for "68.0 of 80.0 GiB"): one decimal, the rule of :func:`pct`."""
    return NA if n is None else _decimal(n / GiB)


def energy(joules: float | None) -> str:
    """Energy in the unit that fits: kWh (and MJ) from 0.01 kWh, kJ below."""
    if joules is None:
        return NA
    if joules >= 36_000:
        return f"{joules / 3.6e6:.2f} kWh ({joules / 1e6:.2f} MJ)"
    return f"{_decimal(joules / 1e3)} kJ"


def watts(w: float | None) -> str:
    """Power in whole watts ("412 W"); below 1 W the rule of :func:`pct`."""
    if w is None:
        return NA
    return f"{w:.0f} W" if w >= 1 else f"{_decimal(w)} W"


def hms(seconds: float | None) -> str:
    """A duration in Slurm's elapsed format: ``[D-]HH:MM:SS``."""
    if seconds is None:
        return NA
    d, s = divmod(int(round(seconds)), 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return f"{d}-{h:02d}:{m:02d}:{s:02d}" if d else f"{h:02d}:{m:02d}:{s:02d}"


def money(amount: float | None, currency: str) -> str:
    """"€12.34", "€1,234", "12.34 SEK"; "n/a" when the amount is unknown (no price set)."""
    if amount is None:
        return NA
    sym = CURRENCY_SYMBOLS.get(currency.upper())
    text = f"{amount:,.0f}" if abs(amount) >= 1000 else f"{amount:,.2f}"
    return f"{sym}{text}" if sym else f"{text}\u00a0{currency}"


def _signed(v: float) -> str:
    return ("+" if v >= 0 else "\u2212") + _decimal(abs(v))


def change(now: float | None, before: float | None) -> str | None:
    """Relative change from ``before`` to ``now`` ("+12.5%", "−5.0%"); None when not comparable."""
    if now is None or before is None or before <= 0:
        return None
    return _signed(100.0 * (now - before) / before) + "%"


def points(now: float | None, before: float | None) -> str | None:
    """Change of a share in percentage points ("+3.1 pts", "−0.4 pts"); None when either is unknown."""
    if now is None or before is None:
        return None
    return _signed(100.0 * (now - before)) + " pts"


def _aware_utc(dt: datetime) -> datetime:
    """The database hands back naive UTC or aware times depending on the driver; both mean UTC here."""
    return dt.replace(tzinfo=UTC) if dt.tzinfo is None else dt.astimezone(UTC)


def utc(dt: datetime | None) -> str:
    """A time for people: "2026-11-23 15:17 UTC"."""
    return NA if dt is None else _aware_utc(dt).strftime("%Y-%m-%d %H:%M UTC")


def utc_seconds(dt: datetime | None) -> str:
    """A moment to the second, for figures that change while a job runs: "2026-11-23 15:17:04 UTC"."""
    return NA if dt is None else _aware_utc(dt).strftime("%Y-%m-%d %H:%M:%S UTC")


def clock(epoch: float) -> str:
    """A moment within a job, as on the card's other times (UTC): "13:20:05"."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S")


def number(x: float | None, digits: int = 6) -> float | None:
    """A figure for machines (``--json``): rounded to ``digits`` decimals, so that binary floating point does
    not show through (0.2066, not 0.20659999999999998); 6 for fractions and GPU-hours, 3 for seconds, 1 for
    joules and watts. None stays None (null: unknown)."""
    return None if x is None else round(float(x), digits)


def iso(dt: datetime | None) -> str | None:
    """A time for machines: ISO 8601 UTC with ``Z``, whole seconds ("2026-11-23T15:17:00Z")."""
    return None if dt is None else _aware_utc(dt).replace(microsecond=0, tzinfo=None).isoformat() + "Z"


class JobIds(Protocol):
    """What :func:`job_label` reads: a job row of the read model (readmodel.JobRow), or an ORM ``Job``."""

    @property
    def job_id(self) -> int: ...
    @property
    def array_job_id(self) -> int | None: ...
    @property
    def array_task_id(self) -> int | None: ...
    @property
    def het_job_id(self) -> int | None: ...
    @property
    def het_job_offset(self) -> int | None: ...


def job_label(job: JobIds) -> str:
    """The id users type: ``123_4`` for an array task, ``123+1`` for a het component, else the raw id."""
    if job.array_job_id is not None and job.array_task_id is not None:
        return f"{job.array_job_id}_{job.array_task_id}"
    if job.het_job_id is not None and job.het_job_offset is not None:
        return f"{job.het_job_id}+{job.het_job_offset}"
    return str(job.job_id)


SPARKS = "\u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"  # ▁▂▃▄▅▆▇█: 0 to 1 in eight steps
NO_DATA = "\u00b7"  # a cell nothing measured: never a low bar, which would read as "idle"


def sparkline(points: Sequence[tuple[float, float | None]], span_s: float, width: int = 40) -> str:
    """A fraction over time as ``width`` cells of ``SPARKS``, so the card shows *when* a job was busy, not
    only its mean. ``points`` are (seconds since the start, fraction or None), each the mean of a bucket
    around its time, as the coarse timelines hold them.

    Each point stands for half the usual spacing of the points on either side (a lone point: the whole
    span), so a timeline coarser than the cells fills them instead of leaving every other one empty, while
    a real hole (the collector was down) stays a hole. A cell is the overlap-weighted mean of the points
    it meets; one that no measured point meets is ``NO_DATA``. Fractions are clipped to [0, 1]. No points
    or no span: an empty string (the caller shows no line rather than a made-up one).
    """
    pts = sorted((min(max(float(t), 0.0), span_s), v) for t, v in points if t is not None)
    if not pts or span_s <= 0 or width <= 0:
        return ""
    gaps = sorted(b[0] - a[0] for a, b in zip(pts, pts[1:], strict=False) if b[0] > a[0])
    half = gaps[len(gaps) // 2] / 2 if gaps else span_s
    cell = span_s / width
    sums, weights = [0.0] * width, [0.0] * width
    for t, v in pts:
        if v is None:
            continue
        v = min(max(float(v), 0.0), 1.0)
        lo, hi = max(t - half, 0.0), min(t + half, span_s)
        for i in range(int(lo // cell), min(int(hi // cell), width - 1) + 1):
            overlap = min(hi, (i + 1) * cell) - max(lo, i * cell)
            if overlap > 0:
                sums[i] += v * overlap
                weights[i] += overlap
    return "".join(SPARKS[min(int(s / w * len(SPARKS)), len(SPARKS) - 1)] if w > 0 else NO_DATA
                   for s, w in zip(sums, weights, strict=True))
