"""Renderers of analysed jobs: the seff-style text card (:mod:`.text`) and the JSON document (:mod:`.json`)."""

from __future__ import annotations

from .json import dumps
from .text import render_card, render_table

__all__ = ["dumps", "render_card", "render_table"]
