"""The documentation: the configuration reference is what the code and the annotated file make, each role's
config file is valid as shipped, the README's links lead somewhere and it stays a README, and the docs site
builds with every link and anchor checked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROLES = ("service", "node", "login")


def run(*argv: str, **kw) -> subprocess.CompletedProcess[str]:  # noqa: ANN003
    env = {k: v for k, v in os.environ.items() if k != "GPUEFF_CONFIG"}
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, **kw)


@pytest.mark.process
def test_the_configuration_reference_is_generated_from_the_config():
    p = run(sys.executable, "tools/config_reference.py", "--check")
    assert p.returncode == 0, p.stderr


def test_the_reference_generator_refuses_a_key_the_annotated_file_lacks(tmp_path, monkeypatch):
    """A key the code declares and etc/gpueff.toml does not document, or a default the file shows otherwise,
    stops the generator: the reference cannot be made from a file that drifted."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import config_reference

    with open(config_reference.ANNOTATED) as fh:
        text = fh.read()
    for broken, said in ((text.replace("stuck_h = 1.0\n", ""), "[spool]: keys not documented: stuck_h"),
                         (text.replace("stuck_h = 1.0\n", "stuck_h = 2.0\n"),
                          "spool.stuck_h = 2.0, the default is 1.0"),
                         (text.replace("stuck_h = 1.0\n", "stuck_h = 1.0\nstale_h = 1.0\n"),
                          "keys the config does not have: stale_h")):
        path = tmp_path / "gpueff.toml"
        path.write_text(broken)
        monkeypatch.setattr(config_reference, "ANNOTATED", str(path))
        with pytest.raises(config_reference.Drift, match=re.escape(said)):
            config_reference.generate()


@pytest.mark.process
@pytest.mark.parametrize("role", ROLES)
def test_each_role_config_file_is_valid_as_shipped(role):
    """`gpueff config check` passes each whole file (a fragment appended to another file would declare
    [site] twice); a node's and a login node's name no database (they have none)."""
    path = os.path.join(ROOT, "etc", f"gpueff-{role}.toml")
    p = run(sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", path, "config", "check")
    assert p.returncode == 0, p.stdout + p.stderr
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    assert data["site"]["cluster"] and data["service"]["api_url"] and data["service"]["user"]
    if role != "service":
        assert "database" not in data.get("paths", {}) and "database_password_file" not in data.get("paths", {})


def links(path: str) -> list[str]:
    with open(path) as fh:
        text = re.sub(r"```.*?```", "", fh.read(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'<img src="([^"]+)"', text)


def anchors(path: str) -> set[str]:
    """The anchors of a Markdown file's headings, as the docs site (Python-Markdown's toc) makes them."""
    from markdown.extensions.toc import slugify

    with open(path) as fh:
        text = re.sub(r"```.*?```", "", fh.read(), flags=re.S)
    return {slugify(h, "-") for h in re.findall(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_is_a_readme_and_its_links_lead_somewhere():
    readme = os.path.join(ROOT, "README.md")
    with open(readme) as fh:
        lines = fh.read().splitlines()
    assert len(lines) <= 250, len(lines)
    assert lines[4:8] == [  # the two commands at the top, as CI and the demo test run them
        "```sh",
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/gpueff demo   # install + "
        "simulated-cluster demo on SQLite",
        "bash tests/setup-services.sh && bash tests/run.sh                                          # the tests "
        "(root: installs/starts PostgreSQL, Chromium, Slurm; GPU tests skip without a GPU)",
        "```"]
    for link in links(readme):
        if link.startswith(("http://", "https://", "mailto:")):
            continue
        target, _, anchor = link.partition("#")
        path = os.path.join(ROOT, target) if target else readme
        assert os.path.exists(path), link
        if anchor:
            assert anchor in anchors(path), link


def test_the_seff_gpu_message_names_a_readme_section_that_exists():
    """seff-gpu's line for a site without the API names the README's section by its title."""
    with open(os.path.join(ROOT, "slurm_gpueff", "cli", "seff.py")) as fh:
        named = re.search(r'README: \\"([^"\\]+)', fh.read().replace('"\n           "', "")).group(1)
    with open(os.path.join(ROOT, "README.md")) as fh:
        assert f"\n## {named}\n" in fh.read(), named


@pytest.mark.process
def test_the_docs_site_builds_with_every_link_checked(tmp_path):
    """mkdocs build --strict: a link to a page or an anchor that does not exist fails it; it fails here too when
    a page links to nowhere (the check is shown to bite on a copy of the docs with one link broken)."""
    mkdocs = shutil.which("mkdocs", path=os.path.dirname(sys.executable))
    assert mkdocs, "mkdocs is in the test extra: pip install -e '.[test]'"
    p = run(mkdocs, "build", "--strict", "-d", str(tmp_path / "site"))
    assert p.returncode == 0, p.stdout + p.stderr
    assert (tmp_path / "site" / "configuration" / "index.html").exists()
    shutil.copytree(os.path.join(ROOT, "docs"), tmp_path / "docs")
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), tmp_path / "mkdocs.yml")
    guide = tmp_path / "docs" / "user-guide.md"
    guide.write_text(guide.read_text().replace("(#exit-status)", "(#exit-codes)", 1))
    broken = subprocess.run([mkdocs, "build", "--strict", "-d", str(tmp_path / "site2")], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert broken.returncode != 0 and "#exit-codes" in broken.stderr, broken.stderr


@pytest.mark.process
def test_the_operations_guide_backs_up_a_sqlite_database_in_use(tmp_path):
    """The SQLite backup command of docs/operations.md, as written (its paths made the test's), while another
    connection holds a write transaction open: the copy is private (umask 077), passes `gpueff db check`,
    and holds the committed rows."""
    import random

    import synthetic
    from dbrows import rows
    from sqlalchemy import text

    from slurm_gpueff import spool
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.ingest import ingest_spool

    with open(os.path.join(ROOT, "docs", "operations.md")) as fh:
        block, = [b for b in re.findall(r"```sh\n(.*?)```", fh.read(), re.S) if ".backup(" in b]
    src, dst = tmp_path / "gpueff.db", tmp_path / "backup" / "gpueff.db"
    dst.parent.mkdir()
    script = (block.replace("/opt/slurm-gpueff/venv/bin/python", sys.executable)
              .replace("/var/lib/slurm-gpueff/gpueff.db", str(src))
              .replace("/srv/backup/gpueff-$(date +%F).db", str(dst)))
    engine = make_engine(str(src))
    for i in range(20):
        spool.write_record(str(tmp_path / "spool"), synthetic.record(500 + i, rng=random.Random(i)))
    assert ingest_spool(engine, str(tmp_path / "spool")).ingested == 20
    committed = rows(engine)
    with engine.connect() as busy:  # a writer in the middle of a transaction
        busy.execute(text("UPDATE job SET job_name = 'uncommitted'"))
        p = subprocess.run(["bash", "-ec", script], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stderr
        busy.rollback()
    assert dst.stat().st_mode & 0o777 == 0o600
    copy = make_engine(str(dst), create=False)
    assert rows(copy) == committed
    cfg = tmp_path / "gpueff.toml"
    cfg.write_text(f'[paths]\ndatabase = "{dst}"\n')
    check = run(sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(cfg), "db", "check")
    assert check.returncode == 0 and "sound" in check.stdout, check.stdout + check.stderr
