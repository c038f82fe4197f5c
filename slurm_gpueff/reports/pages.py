"""The reports' pages: the templates (package data in ``slurm_gpueff/reports/templates/``) rendered through one
Jinja2 environment, and :class:`Page`, a rendered report.

HTML templates (``*.html.j2``) are autoescaped: a job named ``<script>`` is printed as text, never
markup. Plain-text templates and the shared sentences in ``_prose.j2`` are not escaped where they are
defined; an HTML template that prints a sentence escapes it then. Undefined names are errors
(StrictUndefined), so a template typo fails the test suite instead of mailing a blank.
"""

from __future__ import annotations

import base64
import tomllib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape

from .. import fmt


@cache
def environment() -> Environment:
    env = Environment(loader=PackageLoader("slurm_gpueff.reports", "templates"),
                      autoescape=select_autoescape(["html.j2"]), undefined=StrictUndefined,
                      trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.filters.update(pct=fmt.pct, hours=fmt.gpu_hours, stack=stack, words=lambda s: " ".join(str(s).split()))
    return env


def stack(rows: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """(width in whole percent, colour) of each row's ``hours``, summing to 100 (largest remainder), for a
    stacked bar; unknown counts as 0."""
    vals = [max(0.0, r["hours"] or 0.0) for r in rows]
    total = sum(vals)
    if total <= 0:
        return [(0, r["color"]) for r in rows]
    raw = [100.0 * v / total for v in vals]
    out = [int(x) for x in raw]
    for i in sorted(range(len(raw)), key=lambda i: raw[i] - out[i], reverse=True)[: 100 - sum(out)]:
        out[i] += 1
    return list(zip(out, [r["color"] for r in rows], strict=True))


def render(template: str, /, **context: object) -> str:
    return environment().get_template(template).render(**context)


def sentence(name: str, /, **context: object) -> str:
    """One macro of ``_prose.j2`` (a subject line, a headline) as plain text, for Python to use."""
    macro = getattr(environment().get_template("_prose.j2").make_module(context), name)
    return " ".join(str(macro()).split())


@dataclass
class Page:
    """A rendered report: subject, plain text, chart, and the HTML on demand, because where the chart lives
    differs: ``cid:...`` in mail, a file name in the archive, a ``data:`` URI (the default) in one file."""

    template: str
    subject: str
    text: str
    chart: bytes | None
    context: dict[str, Any]

    def html(self, chart_src: str | None = None) -> str:
        if chart_src is None and self.chart:
            chart_src = "data:image/png;base64," + base64.b64encode(self.chart).decode("ascii")
        return render(self.template, **self.context, chart_src=chart_src if self.chart else "")


@cache
def toml(name: str) -> dict[str, Any]:
    """A TOML file among the templates (``advice.toml``)."""
    text = resources.files("slurm_gpueff.reports").joinpath("templates", name).read_text(encoding="utf-8")
    return tomllib.loads(text)
