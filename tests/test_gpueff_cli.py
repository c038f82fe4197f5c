"""The ``gpueff`` dispatcher, run as a process (``python3 -m slurm_gpueff.cli.gpueff``), with real
config files, a real spool and a real SQLite database. GPU figures come from the simulated collector."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sites import sim_record, site_config

from slurm_gpueff import spool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def gpueff(*args, cwd=None, module="slurm_gpueff.cli.gpueff"):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop("GPUEFF_CONFIG", None)
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60,
                          env=env, cwd=cwd)


def cli_config(tmp_path):
    return site_config(tmp_path, tmp_path / "db" / "gpueff.db", cluster="t",
                       extra='[collector]\nbackend = "simulated"\n[analysis]\nbusy_sm_pct = 25\n')


@pytest.mark.process
def test_version():
    p = gpueff("version")
    assert p.returncode == 0 and p.stdout.strip() == "slurm-gpueff 0.1.0"


@pytest.mark.process
def test_config_check_prints_effective_values(tmp_path):
    cfg = cli_config(tmp_path)
    p = gpueff("config", "check", "--config", str(cfg))  # --config also accepted after the subcommand
    assert p.returncode == 0, p.stderr
    assert f"# effective configuration: {cfg} (valid)" in p.stdout
    assert "[analysis]\nnever_used_kernel_pct = 5.0" in p.stdout
    assert "busy_sm_pct = 25.0" in p.stdout and 'backend = "simulated"' in p.stdout
    doc = json.loads(gpueff("--config", str(cfg), "config", "check", "--json").stdout)
    assert doc["source"] == str(cfg) and doc["config"]["analysis"]["busy_sm_pct"] == 25.0


@pytest.mark.process
def test_invalid_config_exits_2_with_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[analysis]\nbusy_sm_pct = 130\n")
    p = gpueff("--config", str(bad), "config", "check")
    assert p.returncode == 2
    assert "analysis.busy_sm_pct = 130.0 is not a percentage" in p.stderr and "Traceback" not in p.stderr
    assert gpueff("--config", str(tmp_path / "missing.toml"), "ingest").returncode == 2


@pytest.mark.process
def test_usage_errors_exit_2():
    assert gpueff().returncode == 2
    assert gpueff("frobnicate").returncode == 2
    p = gpueff("hook", "install")
    assert p.returncode == 2 and "needs a target directory" in p.stderr


@pytest.mark.process
def test_ingest_then_seff_gpu(tmp_path):
    """A finished job's record in the spool -> `gpueff ingest` -> `seff-gpu` shows its card."""
    cfg = cli_config(tmp_path)
    spool.write_record(str(tmp_path / "spool"), sim_record(77, "tiny-kernels", 1, 2.0, cluster="t", node="n1",
                                                           user="u", account="a"))
    os.makedirs(tmp_path / "spool" / "incoming", exist_ok=True)
    (tmp_path / "spool" / "incoming" / "job-78-n1.json").write_text("{not json")

    p = gpueff("--config", str(cfg), "ingest")
    assert p.returncode == 0, p.stderr
    assert "ingested 1, quarantined 1, failed 0" in p.stdout
    assert "job-78-n1.json" in p.stderr  # the quarantined record is named
    assert os.listdir(tmp_path / "spool" / "incoming") == []

    card = gpueff("--config", str(cfg), "77", module="slurm_gpueff.cli.seff")
    assert card.returncode == 0, card.stderr
    assert "Job ID: 77" in card.stdout and "Verdict: Busy but not working" in card.stdout
    assert ("State: ENDED (the Epilog saw exit code 0; Slurm's final state not read from accounting yet)"
            in " ".join(card.stdout.split()))  # not enriched (as read, whatever the wrapping)

    again = gpueff("--config", str(cfg), "ingest", "--quiet")
    assert again.returncode == 0 and again.stdout == ""


@pytest.mark.process
def test_hook_never_fails_even_without_a_job(tmp_path):
    """`gpueff hook epilog` with no Slurm environment logs the problem and still exits 0."""
    cfg = cli_config(tmp_path)
    p = gpueff("--config", str(cfg), "hook", "epilog")
    assert p.returncode == 0


@pytest.mark.process
def test_hook_path_loads_no_database_or_analysis_code(tmp_path):
    cfg = cli_config(tmp_path)
    # hook.main() ends the process (exit 0, after its watchdog); report what was loaded at that point.
    code = ("import sys\nfrom slurm_gpueff.cli import gpueff\ntry:\n    gpueff.main(['--config', sys.argv[1], "
            "'hook', 'prolog'])\nexcept SystemExit as e:\n    rc = e.code\n"
            "heavy = [m for m in ('sqlalchemy', 'sqlmodel', 'slurm_gpueff.analysis', "
            "'slurm_gpueff.storage', 'slurm_gpueff.render') if m in sys.modules]\nprint(rc, heavy)")
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-c", code, str(cfg)], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.stdout.strip().splitlines()[-1] == "0 []", p.stderr


@pytest.mark.process
def test_hook_install_writes_both_hooks(tmp_path):
    p = gpueff("hook", "install", str(tmp_path / "hooks"))
    assert p.returncode == 0, p.stderr
    for kind in ("prolog", "epilog"):
        path = tmp_path / "hooks" / kind
        assert f"installed {path}" in p.stdout and os.access(path, os.X_OK)


@pytest.mark.process
def test_hook_install_replaces_scripts_only_with_force_and_never_through_a_link(tmp_path):
    """Installing again over existing hooks is refused in one line (exit 2) before either script is written;
    --force replaces them, and a symbolic link in DIR named ``epilog`` is replaced itself, its target (here a
    file of the admin's) left as it was."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (tmp_path / "precious.conf").write_text("keep me\n")
    (hooks / "epilog").symlink_to(tmp_path / "precious.conf")
    p = gpueff("hook", "install", str(hooks))
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert p.stderr == (f"gpueff: {hooks}/epilog exists (a symbolic link, not followed): not overwritten; --force "
                        "replaces it\n"), p.stderr
    assert not (hooks / "prolog").exists()  # nothing written when one name is taken
    assert (tmp_path / "precious.conf").read_text() == "keep me\n"
    p = gpueff("hook", "install", str(hooks), "--force")
    assert p.returncode == 0, p.stderr
    assert not (hooks / "epilog").is_symlink() and (hooks / "epilog").read_text().startswith("#!")
    assert (tmp_path / "precious.conf").read_text() == "keep me\n"
    assert all(os.stat(hooks / k).st_mode & 0o777 == 0o755 for k in ("prolog", "epilog"))
    p = gpueff("hook", "install", str(hooks))
    assert p.returncode == 2 and "prolog exists (a file): not overwritten; --force replaces it" in p.stderr


@pytest.mark.process
def test_help_lists_every_command_of_the_registry():
    """``gpueff --help`` is made from the registry: every command, each group's title and examples; an example
    is a command line that parses (one naming a command that went would fail here), and nothing in the help
    names a command set the registry does not have (it said "node agent, Slurm hooks, ingest, demo and config
    check" long after serve, forward, reports and alerts came)."""
    import re

    from slurm_gpueff.cli import gpueff as cli

    p = gpueff("--help")
    assert p.returncode == 0
    (sub,) = [a for a in cli.build_parser()._actions if a.dest == "command"]
    assert {"agent", "live", "hook", "ingest", "db", "serve", "forward", "rollup", "enrich", "backfill", "report",
            "alerts", "demo", "config", "doctor", "version"} <= set(sub.choices)
    for name in sub.choices:
        assert f"\n    {name} " in p.stdout, name
    examples = p.stdout.split("\nexamples:\n", 1)[1]
    for group in cli.GROUPS:
        assert f"\n  {group.TITLE}:\n" in "\n" + examples, group.TITLE
        assert group.EXAMPLES, group.TITLE
        for line, what in group.EXAMPLES:
            assert re.search(rf"\n    gpueff {re.escape(line)} +# {re.escape(what)}\n", examples), line
            args = cli.build_parser().parse_args(line.split())  # exits 2 (SystemExit) if it does not parse
            assert args.run is group.run, line
    named = set(re.findall(r"^    gpueff (\S+)", examples, re.M))
    assert named <= set(sub.choices), named - set(sub.choices)
    assert "ingest, demo and config check" not in p.stdout
    assert max(map(len, p.stdout.splitlines()[:4])) <= 100 and max(map(len, examples.splitlines()[:-1])) <= 80


@pytest.mark.process
def test_demo_help_shows_only_flags_that_do_something():
    """``gpueff demo --help`` shows no ``--keep`` (the demo always keeps its folder: such a flag would do nothing)
    and no ``--config`` (refused: the demo uses a config of its own); the folder's fate is said at --dir."""
    from slurm_gpueff.cli import gpueff as cli

    p = gpueff("demo", "--help")
    assert p.returncode == 0
    assert "--keep" not in p.stdout and "--config" not in p.stdout, p.stdout
    assert "kept afterwards" in " ".join(p.stdout.split())
    assert cli.build_parser().parse_args(["demo", "--dir", "x"]).dir == "x"


@pytest.mark.process
@pytest.mark.parametrize("args, message", [
    (["report", "optout", "--list", "alice"], "--list takes no USER and no --undo"),
    (["report", "optout", "--list", "--undo"], "--list takes no USER and no --undo"),
    (["report", "optout", "--undo"], "--undo needs the USERs to opt back in"),
    (["report", "monthly", "--site"], "--site goes with --account"),
    (["db", "current", "--revision", "abc"], "--revision applies to `db upgrade` only"),
    (["demo", "--config", "x.toml"], "--config does not apply"),
    (["forward", "--batch", "0"], "--batch must be at least 1"),
    (["agent", "--energy-interval", "0"], "--energy-interval must be a positive number"),
    (["agent", "--energy-interval", "nan"], "--energy-interval must be a positive number"),
])
def test_flags_that_do_not_combine_are_refused(tmp_path, args, message):
    """Refused before any config, database or GPU is touched: exit 2 with the reason, nothing done."""
    p = gpueff(*args, cwd=str(tmp_path))
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr and p.stdout == ""
    assert os.listdir(tmp_path) == []  # e.g. the demo built no folder


@pytest.mark.process
def test_agent_command_runs_the_agent(tmp_path):
    """`gpueff agent --once`: one tick and a state file on a GPU node; without NVIDIA's driver, the reason."""
    cfg = cli_config(tmp_path)
    p = gpueff("--config", str(cfg), "agent", "--once")
    if p.returncode == 0:
        assert os.path.exists(tmp_path / "run" / "agent" / "state.json")
    else:
        assert p.returncode == 1 and "gpueff-agent ERROR gpueff agent cannot start" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


def test_every_command_runs_through_the_group_that_lists_it():
    """The registry: each command's parser carries its group's ``run``, and that group's docstring lists it."""
    import re

    from slurm_gpueff.cli import gpueff as cli

    parser = cli.build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    minimal = {"hook": ["prolog"], "db": ["current"], "backfill": ["--since", "now"], "config": ["check"],
               "report": ["status"], "alerts": ["log"]}
    runs = {group.run for group in cli.GROUPS}
    for name in sub.choices:
        args = parser.parse_args([name, *minimal.get(name, [])])
        assert args.command == name and args.run in runs, name
        doc = sys.modules[args.run.__module__].__doc__
        assert re.search(rf"gpueff (\[--config PATH\] )?{name}\b", doc), name


def _pg_down_config(tmp_path):
    """A config naming an unreachable PostgreSQL, its password in a private paths.database_password_file."""
    pw = tmp_path / "db.pw"
    pw.write_text("s3cret\n")
    pw.chmod(0o600)
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[paths]\ndatabase = "postgresql+psycopg://u@127.0.0.1:1/x?connect_timeout=2"\n'
                   f'database_password_file = "{pw}"\n'
                   f'spool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/run"\n')
    return cfg


@pytest.mark.process
def test_database_errors_never_print_its_password(tmp_path):
    """An unreachable PostgreSQL: the one-line error names the database, never the password of its file."""
    p = gpueff("--config", str(_pg_down_config(tmp_path)), "rollup")
    assert p.returncode == 1 and p.stderr.startswith("gpueff: cannot open the job database "
                                                     "postgresql+psycopg://u@127.0.0.1:1/x"), p.stderr
    assert p.stderr.count("\n") == 1, p.stderr
    assert "s3cret" not in p.stderr + p.stdout and "Traceback" not in p.stderr


@pytest.mark.process
def test_db_current_on_an_unreachable_database_is_one_line(tmp_path):
    """``gpueff db current``'s engine connects inside the command: a server that is down gives one line, exit 1,
    no password and no traceback (it used to print SQLAlchemy's traceback)."""
    p = gpueff("--config", str(_pg_down_config(tmp_path)), "db", "current")
    assert p.returncode == 1, p.stderr
    named = "gpueff: job database postgresql+psycopg://u@127.0.0.1:1/x?connect_timeout=2: "
    assert p.stderr.startswith(named) and p.stderr.count("\n") == 1, p.stderr
    assert "s3cret" not in p.stderr + p.stdout and "Traceback" not in p.stderr


@pytest.mark.parametrize("argv", [[], ["frobnicate"], ["config"], ["config", "chk"], ["ingest", "--bogus"],
                                  ["demo", "--dir"], ["x\ny"], ["ingest", "--limit", "a\nb"]])
def test_usage_errors_are_one_line(argv, capsys):
    """argparse's errors, like every other error of gpueff: one line naming the command, exit 2, no usage block."""
    from slurm_gpueff.cli.gpueff import main

    with pytest.raises(SystemExit) as info:
        main(argv)
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("gpueff") and ": error: " in err, err
