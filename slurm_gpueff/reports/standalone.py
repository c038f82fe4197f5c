"""``seff-gpu JOBID --html FILE``: the same card as the mail, as one self-contained HTML file.

The chart is embedded as a ``data:`` URI, so the file opens in any browser with nothing next to it.
Several jobs (an array) give one file each: ``FILE`` with ``-<job id>`` before the extension.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from sqlmodel import Session

from ..config import Config
from ..fmt import job_label
from ..storage.db import make_engine
from ..storage.queries import gpu_timelines
from .card import build_card


def write_html(config: Config, found: Sequence[tuple[Any, list[Any]]], items: Sequence[tuple[Any, Any, Any]],
               path: str) -> list[str]:
    """Write the card(s); ``found`` = (job, GPU rows), ``items`` = (job, figures, diagnosis), same order."""
    engine = make_engine(config.paths.database, create=False)
    try:
        with Session(engine) as session:
            timelines = [gpu_timelines(session, gpus) for _job, gpus in found]
    finally:
        engine.dispose()
    written = []
    stem, ext = os.path.splitext(path)
    for (job, gpus), (_j, fig, diag), tl in zip(found, items, timelines, strict=True):
        card = build_card(job, fig, diag, [tl[g.id] for g in gpus if g.id in tl], config, optout_hint=False)
        out = path if len(items) == 1 else f"{stem}-{job_label(job)}{ext or '.html'}"
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(card.html())
        written.append(out)
    return written
