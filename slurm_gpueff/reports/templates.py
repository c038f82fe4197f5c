"""The Jinja2 environment for the report templates (``reports/*.j2`` in the repository).

HTML templates (``*.html.j2``) are autoescaped: a job named ``<script>`` is printed as text, never
markup. Plain-text templates are not escaped (they are never parsed as HTML). Undefined names are
errors (StrictUndefined), so a template typo fails the test suite instead of mailing a blank.
"""

from __future__ import annotations

import os
from functools import cache
from importlib import resources

from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

from . import fmt


def templates_dir() -> str:
    """Where the templates are: inside the installed package (``templates`` -> ``reports/`` in a checkout)."""
    path = str(resources.files("slurm_gpueff.reports").joinpath("templates"))
    if os.path.isdir(path):
        return path
    # A source tree whose link was lost (e.g. a copy without symlinks): the repository's reports/.
    return os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "reports")


@cache
def environment() -> Environment:
    env = Environment(loader=FileSystemLoader(templates_dir()),
                      autoescape=select_autoescape(enabled_extensions=("html.j2", "html"),
                                                   default_for_string=False),
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                      keep_trailing_newline=True)
    env.filters["pct"] = fmt.pct
    env.filters["hours"] = fmt.hours
    return env


def render(template: str, /, **context: object) -> str:
    return environment().get_template(template).render(**context)
