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

    def total(self, hours_by_model: Iterable[tuple[float | None, str | None]]) -> float | None:
        """The cost of GPU-hours on several models; None when prices are off or any of them is unknown."""
        if not self.enabled:
            return None
        total = 0.0
        for hours, model in hours_by_model:
            cost = self.cost(hours, model)
            if cost is None:
                return None
            total += cost
        return total

    def fmt(self, amount: float | None) -> str | None:
        """The amount in the site's currency; None when prices are off (the templates leave it out)."""
        return fmt.money(amount, self.currency) if self.enabled else None
