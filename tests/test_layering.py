"""Architecture rules, enforced by parsing every module's imports (jobscope style).

Every module of the package is placed in exactly one layer (a top-level module by its name, a
subpackage by its directory); a module may import only its own layer and the layers listed before it.
docs/DESIGN.md ("Layers") explains what each layer is for. A new module that is not placed here fails
`test_every_module_is_placed`: decide where it belongs before it lands.

The hook path (hook.py and every module it reaches) must stay stdlib-only at import time so that the Prolog
and Epilog start in milliseconds: heavy libraries (pynvml) are imported inside functions only. The node's
forwarder loads no database code: nodes have no database.
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
    ("base", {"__init__", "__version__", "errors", "config", "record", "spool", "statedir", "jobstate", "fmt",
              "outfile", "slurm", "access", "readmodel"}),
    ("node", {"node"}),
    ("collectors", {"collectors"}),
    ("hook", {"hook", "live"}),
    ("models", {"models"}),
    ("migrations", {"migrations"}),
    ("storage", {"storage"}),
    ("analysis", {"analysis"}),
    ("render", {"render"}),
    ("reports", {"reports"}),
    ("seff", {"seff"}),
    ("service", {"service"}),
    ("commands", {"cli"}),
]
# Layers that must not import each other although the order alone would allow it. The node side (the agent,
# the backends, the hooks) and the database side (models to render) are two branches that only seff-gpu's
# engine (its live card on the job's own node) and the commands join; the analysis and its rendering work
# on the read model's rows (readmodel.py) that storage or the live view made, and never reach for the database
# or its models themselves. The node agent and the
# service are two processes on different hosts: neither imports the other.
NODE_SIDE = ("node", "collectors", "hook")
DB_SIDE = ("models", "migrations", "storage", "analysis", "render")
APART: list[tuple[str, str]] = [(db, node) for db in DB_SIDE for node in NODE_SIDE] + [
    ("analysis", "storage"), ("render", "storage"), ("analysis", "migrations"), ("render", "migrations"),
    ("analysis", "models"), ("render", "models"),
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


def internal_imports(rel: list[str], tree: ast.AST) -> set[str]:
    """The package's modules ``rel`` imports, anywhere in it (a function's import runs when it is called), as
    paths under slurm_gpueff without ``.py`` ("spool", "collectors/nvml", "access/__init__")."""
    out: set[str] = set()
    for node in ast.walk(tree):
        names: list[list[str]] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[1:] for a in node.names if a.name.split(".")[0] == "slurm_gpueff"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = rel[:-1][: len(rel) - node.level] if node.level > 1 else rel[:-1]
            elif (node.module or "").split(".")[0] == "slurm_gpueff":
                base = []
            else:
                continue
            mod = base + (node.module.split(".")[1 if not node.level else 0:] if node.module else [])
            names = [mod] + [mod + [a.name] for a in node.names]  # "from . import spool" names a module
        for parts in names:
            for i in range(1, len(parts) + 1):  # importing a.b runs a/__init__ first
                out.add("/".join(parts[:i]))
    return {m for m in out if m in MODULE_FILES} | {m + "/__init__" for m in out if m + "/__init__" in MODULE_FILES}


MODULE_FILES = {"/".join(rel): path for rel, path in modules()}


def reached_from(*entries: str) -> set[str]:
    """Every module the entries import, directly or through others, the entries included."""
    seen: set[str] = set()
    todo = list(entries)
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        seen.add(mod)
        path = MODULE_FILES[mod]
        todo += internal_imports(mod.split("/"), ast.parse(read(path), path)) - seen
    return seen


# The hook path: what the Prolog and Epilog import, the backends they load (collectors/choice.py picks one
# in a function) and everything those import in turn.
HOOK_PATH = reached_from("hook")


def test_hook_path_is_stdlib_only_at_import_time():
    stdlib = sys.stdlib_module_names
    assert {"hook", "spool", "collectors/nvml", "collectors/dcgm", "collectors/simulated"} <= HOOK_PATH
    bad = []
    for mod in sorted(HOOK_PATH):
        path = MODULE_FILES[mod]
        tree = ast.parse(read(path), path)
        for name, internal in imported_packages(mod.split("/"), tree, top_level_only=True):
            if not internal and name not in stdlib and name != "__future__":
                bad.append(f"{mod}.py imports {name} at module level")
    assert not bad, "\n".join(bad)


def test_the_hook_path_follows_imports_in_functions():
    """The walk is not vacuous: an import inside a function counts (the hook imports collectors.choice so)."""
    tree = ast.parse("def f():\n    from .collectors.choice import get_collector\n")
    assert {"collectors/__init__", "collectors/choice"} <= internal_imports(["hook"], tree)


HEAVY = ("sqlalchemy", "sqlmodel", "pydantic", "pynvml", "argparse", "jinja2")


@pytest.mark.process
@pytest.mark.parametrize("module", ["slurm_gpueff.hook", "slurm_gpueff.collectors.base",
                                    "slurm_gpueff.collectors.nvml", "slurm_gpueff.collectors.simulated"])
def test_hook_modules_load_no_heavy_library(module):
    """Importing the hook path must not pull in SQLAlchemy, SQLModel, pydantic, pynvml or argparse."""
    code = (f"import sys, {module}; heavy = {list(HEAVY)!r}; print(','.join(m for m in heavy if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imports {out.stdout.strip()}"


def imported_under_importtime(args: list[str], **kw) -> set[str]:
    """What a Python process imported (``-X importtime``): every top-level name, and the package's modules."""
    p = subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=ROOT), timeout=120, **kw)
    names = {ln.split("|")[-1].strip() for ln in p.stderr.splitlines() if ln.startswith("import time:")}
    return {n.split(".")[0] for n in names} | {n for n in names if n.startswith("slurm_gpueff.")}


@pytest.mark.process
def test_a_forward_pass_loads_no_database_code(tmp_path):
    """``gpueff forward --once`` runs on nodes, which have no database by design: a whole pass over a spool
    with a record (pushed to a service that is not there) loads no SQLAlchemy, SQLModel or pydantic, nor
    the package's database side."""
    from hooksite import make_record

    from slurm_gpueff import spool

    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/run"\nspool_dir = "{tmp_path}/spool"\n'
                   '[service]\napi_url = "http://127.0.0.1:9"\napi_timeout_s = 2\n')
    spool.write_record(str(tmp_path / "spool"), make_record(7))
    code = ("import sys; from slurm_gpueff.cli.gpueff import main\n"
            "sys.exit(main(['--config', sys.argv[1], 'forward', '--once']))")
    names = imported_under_importtime(["-c", code, str(cfg)])
    assert "slurm_gpueff.node.push" in names  # the pass ran
    assert os.path.exists(tmp_path / "run" / "forward.json")
    loaded = names & {"sqlalchemy", "sqlmodel", "pydantic", "alembic", "slurm_gpueff.models", "slurm_gpueff.storage",
                      "slurm_gpueff.analysis", "slurm_gpueff.render"}
    assert not loaded, f"a forward pass loads {sorted(loaded)}"


@pytest.mark.process
def test_the_agent_loads_no_database_code(tmp_path):
    """``gpueff agent`` wires the agent's process with all it serves (live records, seff-gpu's live card): none
    of that loads SQLAlchemy, SQLModel or pydantic at start (here, with no GPU, it stops after wiring; with
    one it ticks once)."""
    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[paths]\nstate_dir = "{tmp_path}/run"\nspool_dir = "{tmp_path}/spool"\n')
    code = ("import sys; from slurm_gpueff.cli.gpueff import main\n"
            "sys.exit(main(['--config', sys.argv[1], 'agent', '--once']))")
    names = imported_under_importtime(["-c", code, str(cfg)])
    assert {"slurm_gpueff.node.run", "slurm_gpueff.live", "slurm_gpueff.seff.livecard"} <= names
    loaded = names & {"sqlalchemy", "sqlmodel", "pydantic", "alembic", "slurm_gpueff.models", "slurm_gpueff.storage.db"}
    assert not loaded, f"gpueff agent loads {sorted(loaded)} at start"


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
