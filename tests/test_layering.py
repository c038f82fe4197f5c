"""Architecture rules, enforced by parsing every module's imports (jobscope style).

Every module of the package is placed in exactly one layer (a top-level module by its name, a
subpackage by its directory); a module may import only its own layer and the layers listed before it.
docs/DESIGN.md ("Layers") explains what each layer is for. A new module that is not placed here fails
`test_every_module_is_placed`: decide where it belongs before it lands.

The hook path (base, collectors, hook) must stay stdlib-only at import time so that the Prolog and
Epilog start in milliseconds: heavy libraries (pynvml) are imported inside functions only.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PKG = os.path.join(ROOT, "slurm_gpueff")

# Lowest first. A module may import its own layer and the layers before it, never a later one.
LAYERS: list[tuple[str, set[str]]] = [
    ("base", {"__init__", "__version__", "errors", "config", "record", "spool", "jobstate", "fmt", "outfile", "slurm",
              "access"}),
    ("collectors", {"collectors"}),
    ("hook", {"hook"}),
    ("models", {"models"}),
    ("migrations", {"migrations"}),
    ("storage", {"storage"}),
    ("analysis", {"analysis"}),
    ("render", {"render"}),
    ("reports", {"reports"}),
    ("node", {"node"}),
    ("service", {"service"}),
    ("commands", {"cli"}),
]
# Layers that must not import each other although the order alone would allow it. The node side
# (collectors, hook) and the database side (models to render) are two branches that only the node agent
# (node: its live card on the job's own node) and the commands join; the analysis and its rendering work
# on plain data that storage fetched, and never reach for the database themselves. The node agent and the
# service are two processes on different hosts: neither imports the other.
NODE_SIDE = ("collectors", "hook")
DB_SIDE = ("models", "migrations", "storage", "analysis", "render")
APART: list[tuple[str, str]] = [(db, node) for db in DB_SIDE for node in NODE_SIDE] + [
    ("analysis", "storage"), ("render", "storage"), ("analysis", "migrations"), ("render", "migrations"),
    ("service", "node")]
RANK = {module: i for i, (_layer, names) in enumerate(LAYERS) for module in names}
LAYER_NAME = {module: layer for layer, names in LAYERS for module in names}


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


def test_every_module_is_placed():
    unplaced = sorted({"/".join(rel) + ".py" for rel, _ in modules() if layer_of(rel) not in RANK})
    assert not unplaced, "modules in no layer of LAYERS (place them):\n" + "\n".join(unplaced)


def test_layers_import_one_way():
    bad = []
    apart = {(a, b) for a, b in APART} | {(b, a) for a, b in APART}
    for rel, path in modules():
        own = layer_of(rel)
        if own not in RANK:
            continue  # reported by test_every_module_is_placed
        for name, internal in imported_packages(rel, ast.parse(read(path), path)):
            if not internal:
                continue
            where = f"{'/'.join(rel)}.py ({LAYER_NAME[own]}) imports slurm_gpueff.{name}"
            if name not in RANK:
                bad.append(f"{where}, which is in no layer")
            elif RANK[name] > RANK[own]:
                bad.append(f"{where} from the later layer {LAYER_NAME[name]}")
            elif (LAYER_NAME[own], LAYER_NAME[name]) in apart:
                bad.append(f"{where}: {LAYER_NAME[own]} and {LAYER_NAME[name]} are kept apart")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_layer_rules_catch_a_violation(tmp_path):
    """The rules are not vacuous: an upward import is reported."""
    tree = ast.parse("from ..storage import db\n")
    names = [name for name, internal in imported_packages(["analysis", "x"], tree) if internal]
    assert names == ["storage"] and RANK["storage"] < RANK["analysis"]
    assert ("analysis", "storage") in APART
    tree = ast.parse("from .cli import seff\n")
    names = [name for name, internal in imported_packages(["record"], tree) if internal]
    assert names == ["cli"] and RANK["cli"] > RANK["record"]


HOOK_PATH = {name for layer, names in LAYERS[:3] for name in names}


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


@pytest.mark.process
@pytest.mark.parametrize("module", ["slurm_gpueff.hook", "slurm_gpueff.collectors.base",
                                    "slurm_gpueff.collectors.nvml", "slurm_gpueff.collectors.simulated"])
def test_hook_modules_load_no_heavy_library(module):
    """Importing the hook path must not pull in SQLAlchemy, SQLModel, pydantic, pynvml or argparse."""
    code = (f"import sys, {module}; heavy = ['sqlalchemy', 'sqlmodel', 'pydantic', 'pynvml', 'argparse', "
            "'jinja2']; print(','.join(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


# Who may start processes, and why. Every Slurm client command (sacct, sacctmgr, squeue, scontrol, scancel)
# goes through slurm/runner.py: configured paths, time limits, one error type, one place to log.
SUBPROCESS_USERS = {
    "slurm/runner.py": "the one runner of Slurm's client commands",
    "access/munge.py": "munge and unmunge, MUNGE's own clients (not Slurm's)",
    "cli/demo.py": "runs the installed hook scripts as slurmd would",
}
SLURM_COMMANDS = ("sacct", "sacctmgr", "squeue", "scontrol", "scancel", "sbatch", "srun", "salloc", "sinfo")


def test_only_the_runner_starts_slurm_commands():
    bad = []
    for rel, path in modules():
        where = "/".join(rel) + ".py"
        tree = ast.parse(read(path), path)
        starts = {name for name, internal in imported_packages(rel, tree) if not internal} & {"subprocess", "pty"}
        starts |= {"os.exec/spawn/popen" for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                   and isinstance(node.value, ast.Name) and node.value.id == "os"
                   and node.attr.startswith(("exec", "spawn", "popen", "system", "posix_spawn"))}
        if starts and where not in SUBPROCESS_USERS:
            bad.append(f"{where} starts processes ({', '.join(sorted(starts))})")
        if where != "slurm/runner.py" and where in SUBPROCESS_USERS:
            literals = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            bad += [f"{where} names the Slurm command {c!r}" for c in SLURM_COMMANDS if c in literals]
    assert not bad, "\n".join(bad)


def test_the_runner_rule_catches_a_stray_call(tmp_path):
    """The rule is not vacuous: a module that imports subprocess is found."""
    tree = ast.parse("import subprocess\nsubprocess.run(['squeue'])\n")
    assert "subprocess" in {name for name, internal in imported_packages(["reports", "x"], tree) if not internal}


def test_no_module_imports_another_modules_private_names():
    bad = []
    for rel, path in modules():
        for node in ast.walk(ast.parse(read(path), path)):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("slurm_gpueff")):
                bad += [f"{'/'.join(rel)}.py imports {a.name} from {'.' * node.level}{node.module or ''}"
                        for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
    assert not bad, "\n".join(bad)
