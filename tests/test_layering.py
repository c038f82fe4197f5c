"""Architecture rules, enforced by parsing every module's imports (jobscope style).

Layers, lowest first; a layer may import only layers below it:

    base (errors, config, jobid, record, spool, slurmenv) -> collectors -> hook
    models -> storage ; models -> analysis -> render -> cli (cli and demo may import anything)

The hook path (hook and everything it imports) must stay stdlib-only at import time so the Prolog
and Epilog start in milliseconds: heavy libraries (pynvml) are imported inside functions only.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "slurm_gpueff")

BASE = {"errors", "config", "jobid", "record", "spool", "slurmenv", "__init__"}
FORBIDDEN = {
    # layer (first path component) -> packages it must never import, at any depth
    "collectors": {"storage", "analysis", "render", "cli", "models", "demo", "hook"},
    "hook": {"storage", "analysis", "render", "cli", "models", "demo"},
    "models": {"storage", "analysis", "render", "cli", "collectors", "hook", "demo"},
    "storage": {"analysis", "render", "cli", "collectors", "hook", "demo"},
    "analysis": {"storage", "render", "cli", "collectors", "hook", "demo"},
    "render": {"storage", "cli", "collectors", "hook", "demo"},
}
for name in BASE:
    FORBIDDEN[name] = {"storage", "analysis", "render", "cli", "models", "collectors", "hook", "demo"}
# issue 3: the sacct reader and the privacy rule sit with the base modules (storage and cli use them)
for name in ("sacct", "privacy"):
    FORBIDDEN[name] = {"storage", "analysis", "render", "cli", "models", "collectors", "hook", "demo"}
# doctor (gpueff doctor) sits with cli: it probes collectors and storage; nothing below may import it.
for layer in ("collectors", "hook", "models", "storage", "analysis", "render", *BASE):
    FORBIDDEN[layer] = FORBIDDEN[layer] | {"doctor"}
# reports (mail cards, monthly summaries; issue 5) sit above storage, analysis and render, beside cli:
# nothing below them may import them, and summarize (run by ingest) must not pull in mail or Jinja2.
for layer in ("collectors", "hook", "models", "storage", "analysis", "render", "summarize", *BASE):
    FORBIDDEN[layer] = FORBIDDEN.get(layer, set()) | {"reports"}
# service (gpueff serve/forward, /metrics; issue 4) sits beside cli: nothing below may import it.
# migrations (Alembic scripts) see only models; only storage.migrate points Alembic at them.
for layer in ("collectors", "hook", "models", "storage", "analysis", "render", "summarize", "reports", *BASE):
    FORBIDDEN[layer] = FORBIDDEN.get(layer, set()) | {"service"}
FORBIDDEN["migrations"] = {"storage", "analysis", "render", "cli", "collectors", "hook", "demo", "summarize",
                           "service", "reports"}
# summarize sits above storage and analysis (it writes the analysis back to the job rows).
for layer in ("collectors", "hook", "models", "storage", "analysis", "render", *BASE):
    FORBIDDEN[layer] = FORBIDDEN[layer] | {"summarize"}


def read(path: str) -> str:
    with open(path) as fh:
        return fh.read()


def modules():
    for dirpath, _dirs, files in os.walk(PKG):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, PKG)[:-3].split(os.sep)
                yield rel, path


def imported_packages(rel: list[str], tree: ast.AST, top_level_only: bool = False):
    """Yield (first component under slurm_gpueff or external top-level name, is_internal)."""
    nodes = tree.body if top_level_only else ast.walk(tree)  # type: ignore[attr-defined]
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "slurm_gpueff":
                    yield (parts[1] if len(parts) > 1 else "__init__"), True
                else:
                    yield parts[0], False
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = rel[:-1][: len(rel) - node.level] if node.level > 1 else rel[:-1]
                parts = base + (node.module.split(".") if node.module else [])
                if not parts:  # "from .. import x" at the package root
                    parts = [a.name for a in node.names][:1]
                yield parts[0], True
            elif node.module and node.module.split(".")[0] == "slurm_gpueff":
                parts = node.module.split(".")
                yield (parts[1] if len(parts) > 1 else "__init__"), True
            elif node.module:
                yield node.module.split(".")[0], False


def layer_of(rel: list[str]) -> str:
    return rel[0]


def test_layers_import_one_way():
    bad = []
    for rel, path in modules():
        tree = ast.parse(read(path), path)
        forbidden = FORBIDDEN.get(layer_of(rel), set())
        for name, internal in imported_packages(rel, tree):
            if internal and name in forbidden:
                bad.append(f"{'/'.join(rel)}.py imports slurm_gpueff.{name}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


HOOK_PATH = {"collectors", "hook", "errors", "config", "jobid", "record", "spool", "slurmenv", "__init__"}


def test_hook_path_is_stdlib_only_at_import_time():
    stdlib = sys.stdlib_module_names
    bad = []
    for rel, path in modules():
        if layer_of(rel) not in HOOK_PATH:
            continue
        tree = ast.parse(read(path), path)
        for name, internal in imported_packages(rel, tree, top_level_only=True):
            if not internal and name not in stdlib and name != "__future__":
                bad.append(f"{'/'.join(rel)}.py imports {name} at module level")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("module", ["slurm_gpueff.hook", "slurm_gpueff.collectors.select",
                                    "slurm_gpueff.collectors.nvml", "slurm_gpueff.collectors.simulated"])
def test_hook_modules_load_no_heavy_library(module):
    """Importing the hook path must not pull in SQLAlchemy, SQLModel, pydantic, pynvml or argparse."""
    code = (f"import sys, {module}; heavy = ['sqlalchemy', 'sqlmodel', 'pydantic', 'pynvml', 'argparse', "
            "'jinja2']; print(','.join(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"
