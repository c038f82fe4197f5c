"""Numbers as the reports print them, and the price of GPU-hours.

The same rules as the terminal card (``render.text``): a small measured value never reads as 0, an
unmeasured one reads "n/a" (the templates add the reason), and money is shown only where the site set a
price for the GPU model (``reports.price_per_gpu_hour``): a cost we cannot know is not guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..render.text import gpu_hours as _gpu_hours
from ..render.text import pct as _pct

SYMBOLS = {"EUR": "\u20ac", "USD": "$", "GBP": "\u00a3", "CHF": "CHF\u00a0", "JPY": "\u00a5"}


def pct(x: float | None) -> str:
    """A fraction as a percentage ("0.76%", "42.0%"), "n/a" when unknown."""
    return _pct(x)


def hours(h: float | None) -> str:
    """GPU-hours with enough digits that a short job does not read 0.00; "n/a" when unknown."""
    if h is None:
        return "n/a"
    if h >= 100:
        return f"{h:,.0f}"
    return _gpu_hours(h)


def share(part: float | None, whole: float | None) -> float | None:
    """part / whole, None when either is unknown or whole is 0."""
    if part is None or not whole:
        return None
    return part / whole


def money(amount: float | None, currency: str) -> str:
    """"€12.34" / "1,234 CHF"; "n/a" when the amount is unknown (no price set)."""
    if amount is None:
        return "n/a"
    sym = SYMBOLS.get(currency.upper())
    text = f"{amount:,.0f}" if abs(amount) >= 1000 else f"{amount:,.2f}"
    return f"{sym}{text}" if sym else f"{text}\u00a0{currency}"


def signed_pct_change(now: float | None, before: float | None) -> str | None:
    """"+12%" / "−5%" change from ``before`` to ``now``; None when not comparable."""
    if now is None or before is None or before <= 0:
        return None
    change = 100.0 * (now - before) / before
    sign = "+" if change >= 0 else "\u2212"
    return f"{sign}{abs(change):.0f}%"


def signed_points(now: float | None, before: float | None) -> str | None:
    """Change of a share in percentage points: "+3.1 pts" / "−0.4 pts"."""
    if now is None or before is None:
        return None
    d = 100.0 * (now - before)
    sign = "+" if d >= 0 else "\u2212"
    return f"{sign}{abs(d):.1f} pts"


class Prices:
    """Price of one GPU-hour by GPU model (``reports.price_per_gpu_hour``; key "default" for the rest)."""

    def __init__(self, table: Mapping[str, Any] | None, currency: str = "EUR"):
        self.table = {str(k): float(v) for k, v in (table or {}).items()}
        self.currency = currency

    @property
    def enabled(self) -> bool:
        return bool(self.table)

    def of(self, model: str | None) -> float | None:
        """The price for a model, else the default, else None (unknown)."""
        if model is not None and model in self.table:
            return self.table[model]
        return self.table.get("default")

    def cost(self, gpu_hours: float | None, model: str | None) -> float | None:
        price = self.of(model)
        if gpu_hours is None or price is None:
            return None
        return gpu_hours * price

    def fmt(self, amount: float | None) -> str:
        return money(amount, self.currency)


def widths(values: list[float | None]) -> list[int]:
    """Whole percentages summing to 100 (largest remainder), for stacked bars; unknown counts as 0."""
    vals = [max(0.0, v or 0.0) for v in values]
    total = sum(vals)
    if total <= 0:
        return [0] * len(vals)
    raw = [100.0 * v / total for v in vals]
    out = [int(r) for r in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: 100 - sum(out)]:
        out[i] += 1
    return out
