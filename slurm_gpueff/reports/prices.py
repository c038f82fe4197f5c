"""The price of GPU-hours, and shares of them.

Money is shown only where the site set a price for the GPU model (``reports.price_per_gpu_hour``; key
"default" for the rest): a cost we cannot know is not guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .. import fmt


def share(part: float | None, whole: float | None) -> float | None:
    """part / whole, None when either is unknown or whole is 0."""
    if part is None or not whole:
        return None
    return part / whole


def bar_part(key: str, hours: float | None, whole: float | None, cost: str | None, color: str) -> dict[str, Any]:
    """One part of a stacked GPU-hours bar, as the card and the monthly templates print it."""
    return {"key": key, "hours": hours, "hours_text": fmt.gpu_hours(hours), "share_text": fmt.pct(share(hours, whole)),
            "cost_text": cost, "color": color}


class Prices:
    def __init__(self, table: Mapping[str, float] | None, currency: str = "EUR"):
        self.table = {str(k): float(v) for k, v in (table or {}).items()}
        self.currency = currency

    @property
    def enabled(self) -> bool:
        return bool(self.table)

    def total(self, hours_by_model: Iterable[tuple[float | None, str | None]]) -> float | None:
        """The cost of GPU-hours on several models, each at its model's price, else the "default" one;
        None when prices are off or any hours or price is unknown."""
        if not self.enabled:
            return None
        total = 0.0
        for hours, model in hours_by_model:
            price = self.table.get(model or "default", self.table.get("default"))
            if hours is None or price is None:
                return None
            total += hours * price
        return total

    def fmt(self, amount: float | None) -> str | None:
        """The amount in the site's currency; None when prices are off (the templates leave it out)."""
        return fmt.money(amount, self.currency) if self.enabled else None
