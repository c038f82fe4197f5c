"""PNG charts for the reports (matplotlib, Agg backend): the job's activity over time, and the monthly
split of GPU-hours per user or account.

Unmeasured points (None) are gaps, never zeros. matplotlib is imported inside the functions: only
reports pay for it. Figures are made with matplotlib's object API, not pyplot: pyplot keeps every open
figure in a process-wide registry that the service's threads (cards, monthly summaries) would share, and
the style is matplotlib's process-wide rcParams, so one chart is drawn at a time (:func:`_drawing`).

``gpueff serve`` has its charts drawn by one child process (:func:`draw_apart`): a chart is about 0.1 s of
CPU in matplotlib, and in the service's own process it held the interpreter lock that the nodes' pushes,
the API's answers and the analysis share (after an outage, the backlog's cards at once); the child also
keeps matplotlib's memory out of the service. Commands draw in their own process.
"""

from __future__ import annotations

import contextlib
import io
import logging
import math
import multiprocessing
import pickle
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

COLORS = {"kernel": "#8a94a6", "sm": "#1b7f3b", "tensor": "#7b3fa0",
          "idle": "#c9ced6", "underfilled": "#e8a33d", "active": "#1b7f3b", "unmeasured": "#eef0f3"}
WIDTH_PX = 600  # the size the HTML shows; the PNG has twice as many pixels, to stay sharp on high-DPI screens
DPI = 200


STYLE: dict[RcKeyType, Any] = {"font.family": "DejaVu Sans", "font.size": 8, "axes.edgecolor": "#b0b6c0",
                               "axes.labelcolor": "#333a44", "xtick.color": "#555c66", "ytick.color": "#555c66"}
_ONE_AT_A_TIME = threading.Lock()
CHILD_WAIT_S = 120.0  # the longest a chart is waited for from the child; then it is drawn here
log = logging.getLogger("gpueff.reports")
_T = TypeVar("_T")


class _Child:
    """The child process that draws this process's charts while :func:`draw_apart` is on."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pool: ProcessPoolExecutor | None = None

    @staticmethod
    def _new_pool() -> ProcessPoolExecutor:
        """One worker, "spawn": a fresh interpreter, never a fork of a process with threads."""
        return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))

    def start(self) -> None:
        with self.lock:
            if self.pool is None:
                self.pool = self._new_pool()

    def stop(self) -> None:
        with self.lock:
            pool, self.pool = self.pool, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def draw(self, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in the child, or here where there is none or it fails (a new one next time)."""
        pool = self.pool
        if pool is None:
            return fn(*args)
        try:
            return pool.submit(fn, *args).result(timeout=CHILD_WAIT_S)
        except (BrokenProcessPool, FutureTimeout, OSError, pickle.PicklingError) as exc:
            log.warning("charts: the drawing process failed (%s); this chart is drawn here",
                        type(exc).__name__ if not str(exc) else exc)
            with self.lock:
                if self.pool is pool:
                    pool.shutdown(wait=False, cancel_futures=True)
                    self.pool = self._new_pool()
            return fn(*args)


_CHILD = _Child()


def draw_apart() -> None:
    """Draw this process's charts in one child process from now on (``gpueff serve``); see the module's
    docstring. The child starts with the first chart."""
    _CHILD.start()


def draw_here() -> None:
    """Stop the child (if any): charts are drawn in this process again."""
    _CHILD.stop()


@contextlib.contextmanager
def _drawing(height_px: int) -> Iterator[Any]:
    """A new figure of ``height_px`` (at WIDTH_PX) in the charts' style, drawn by this thread alone."""
    import matplotlib
    from matplotlib.figure import Figure

    with _ONE_AT_A_TIME, matplotlib.rc_context(STYLE):
        yield Figure(figsize=(WIDTH_PX / 100, height_px / 100), dpi=DPI)


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, facecolor="white")  # the Agg canvas: no GUI backend is touched
    return buf.getvalue()


def _frame(fig: Any, ax: Any, grid: str, at: tuple[float, float], title: str) -> None:
    """The look both charts share: light grid lines, no top and right frame, a bold title."""
    ax.grid(axis=grid, color="#e3e6ea", lw=0.6)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    fig.text(*at, title, fontsize=8.5, color="#333a44", weight="bold", va="center")


def job_series(timelines: Sequence[Sequence[Sequence[Any]]]) -> tuple[list[float], dict[str, list[float]]]:
    """Job-wide series (hours since start; kernel, SM, tensor in percent, NaN where no GPU measured it).

    Each GPU's points are ``[t_offset_s, k, s, t]``. GPUs are put on the longest GPU's time grid by linear
    interpolation (GPUs of one job are sampled together, so the grids nearly agree) and averaged.
    """
    import numpy as np

    series = [sorted((p for p in tl if p and p[0] is not None), key=lambda p: float(p[0]))
              for tl in timelines if tl]
    series = [s for s in series if s]
    if not series:
        return [], {}
    grid = np.array([float(p[0]) for p in max(series, key=len)])
    out: dict[str, list[float]] = {}
    for col, name in ((1, "kernel"), (2, "sm"), (3, "tensor")):
        stacked = []
        for s in series:
            ts = np.array([float(p[0]) for p in s])
            vals = np.array([float(p[col]) if len(p) > col and p[col] is not None else math.nan for p in s])
            ok = ~np.isnan(vals)
            if ok.sum() == 0:
                continue
            stacked.append(np.interp(grid, ts[ok], vals[ok]))
        out[name] = (np.mean(stacked, axis=0) * 100.0).tolist() if stacked else [math.nan] * len(grid)
    return (grid / 3600.0).tolist(), out


def job_chart(timelines: Sequence[Sequence[Sequence[Any]]], gpu_count: int) -> bytes | None:
    """Kernel-, SM- and tensor-active over the job as PNG, or None without a timeline. A multi-GPU job
    shows the job-wide mean (an idle GPU pulls it down, which is the point) and, up to 16 GPUs, each GPU's
    SM-active as a thin line, so "1 of 4 GPUs did all the work" is visible, not averaged away."""
    return _CHILD.draw(_job_chart, [[list(p) for p in tl] for tl in timelines], gpu_count)


def _job_chart(timelines: Sequence[Sequence[Sequence[Any]]], gpu_count: int) -> bytes | None:
    hours, s = job_series(timelines)
    if len(hours) < 2 or all(math.isnan(v) for vals in s.values() for v in vals):
        return None
    height = 210
    with _drawing(height) as fig:
        return _job_png(fig, height, timelines, gpu_count, hours, s)


def _job_png(fig: Any, height: int, timelines: Sequence[Sequence[Sequence[Any]]], gpu_count: int,
             hours: list[float], s: dict[str, list[float]]) -> bytes:
    ax = fig.add_axes((0.075, 64 / height, 0.905, 1 - 96 / height))
    if 1 < gpu_count <= 16 and len(timelines) > 1:
        for n, tl in enumerate(timelines):
            h1, s1 = job_series([tl])
            if h1 and not all(math.isnan(v) for v in s1["sm"]):
                ax.plot(h1, s1["sm"], color=COLORS["sm"], lw=0.8, alpha=0.35,
                        label="each GPU's SM-active" if n == 0 else None)
    ax.plot(hours, s["kernel"], color=COLORS["kernel"], lw=1.6, ls=(0, (4, 2)),
            label='kernel-active ("GPU util")')
    ax.plot(hours, s["sm"], color=COLORS["sm"], lw=2.0, label="SM-active")
    # dotted and on top: where SM and tensor activity are equal (both 0 on an idle GPU), both stay visible
    ax.plot(hours, s["tensor"], color=COLORS["tensor"], lw=1.6, ls=(0, (1, 1.5)), label="tensor-active", zorder=3)
    ax.set_ylim(-3, 105)  # a line at 0 drawn above the axis, not hidden in it
    ax.set_xlim(0, max(hours[-1], 1e-9))
    ax.set_yticks([0, 25, 50, 75, 100], ["0", "25", "50", "75", "100%"])
    ax.set_xlabel("hours since the job started", labelpad=2)
    what = f" (mean of its {gpu_count} GPUs)" if gpu_count > 1 else ""
    _frame(fig, ax, "y", (0.075, 1 - 14 / height), f"Activity over the job{what}")
    fig.legend(loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=4, frameon=False, fontsize=7,
               columnspacing=1.2, handlelength=1.8)
    return _png(fig)


def split_chart(rows: Sequence[dict[str, Any]], title: str) -> bytes | None:
    """Stacked horizontal bars: per row (``label``, ``active``, ``underfilled``, ``idle``, ``unmeasured``
    GPU-hours), largest first as given. None when there is nothing to draw."""
    return _CHILD.draw(_split_chart, [dict(r) for r in rows], title)


def _split_chart(rows: Sequence[dict[str, Any]], title: str) -> bytes | None:
    rows = [r for r in rows if (r.get("allocated") or 0) > 0][:12]
    if not rows:
        return None
    height = 80 + 30 * len(rows)
    with _drawing(height) as fig:
        return _split_png(fig, height, rows, title)


def _split_png(fig: Any, height: int, rows: Sequence[dict[str, Any]], title: str) -> bytes:
    ax = fig.add_axes((0.2, 56 / height, 0.76, 1 - 86 / height))
    labels = [str(r["label"])[:20] for r in rows][::-1]
    left = [0.0] * len(rows)
    parts = (("active", "SM-active"), ("underfilled", "busy, SMs not active"), ("idle", "idle"),
             ("unmeasured", "not measured"))
    for key, name in parts:
        vals = [float(r.get(key) or 0.0) for r in rows][::-1]
        if not any(vals) and key == "unmeasured":
            continue
        ax.barh(labels, vals, left=left, color=COLORS[key], label=name, height=0.62,
                edgecolor="#9aa1ab" if key == "unmeasured" else "none", lw=0.5)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("GPU-hours")
    ax.set_axisbelow(True)
    _frame(fig, ax, "x", (0.02, 1 - 16 / height), title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.4, -30 / (height * (1 - 86 / height))), ncol=4,
              frameon=False, fontsize=7.5)
    return _png(fig)
