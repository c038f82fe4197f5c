"""The site guide (docs/site-guide.md), executed as written: its fenced blocks marked ``<!-- site: ROLE -->``
are extracted and run, in order, on the hosts of a real site:

- the service host and a login node: this machine (Debian 12), its own munged and its /usr/bin/python3. The
  package goes in by the guide's route for hosts without PyPI: a wheelhouse made with the guide's commands,
  then installed with pip reading no config file and no index (``--no-index``), so that it is complete;
- two GPU nodes: the real Slurm 26.05 of the Debian sid chroot (tests/slurm/chroot/), two slurmds with fake
  GPUs (``NNODES=2``), the package installed *inside* the chroot from PyPI with the chroot's own python3, as
  on a GPU node of another OS release. The two slurmds share the chroot's file system, so one node spool and
  one ``gpueff forward`` serve both; the records of both nodes go through it.

Each role gets its own file from etc/ (etc/gpueff-service.toml, -node, -login), as the guide installs them;
the login node's file goes to a folder of the test instead of /etc/slurm-gpueff (this host is the service
host too, whose file is there), named to the login role's commands by ``GPUEFF_CONFIG``.

One munge key on every host (the chroot's is the host's), users alice and bob (same uids everywhere),
jobs by both, alice's ``seff-gpu`` from the login role (showing her job, refusing bob's), and the monthly
summary sent through a real SMTP server on loopback. Then the site moves to PostgreSQL as the guides write
it (docs/site-guide.md "PostgreSQL", docs/operations.md "SQLite to PostgreSQL"): the role and database on
this machine's PostgreSQL server (made by the test's run only, marked by a comment, dropped at the end), the
service stopped, the password file, the config, ``gpueff db copy`` of the SQLite history, the service
started again; alice's jobs before and after the move are both shown.

What cannot run here is stood in for, and only that: systemd (no systemd runs on this machine or in the
chroot) by a ``systemctl`` on PATH that starts a unit's ``ExecStart`` with its ``Environment``
(``enable --now``), and the edit of each role's file that the guide asks the admin to make by hand,
applied from the guide's own TOML block plus the test site's values (its cluster name, the simulated
collector on fake GPUs, the chroot's sacct client, the loopback SMTP server, fast schedules).
Slurm's Prolog/Epilog are the guide's paths, given to the cluster's slurm.conf as etc/slurm.conf.snippet
says. Everything the guide installs into system paths is removed afterwards; the test refuses to run
where an install it did not make exists.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.install, pytest.mark.slurm, pytest.mark.smtp, pytest.mark.process]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
CHROOT = "/srv/slurm-sid"
SYS_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CLUSTER = "gpueffsite"
ACCOUNT = "research"
LEAD = "carol"  # [leads]: gets the account's monthly summary (an address, not a Slurm user)
OPT, ETC = "/opt/slurm-gpueff", "/etc/slurm-gpueff"
INSTALLED = [OPT, ETC, "/var/lib/slurm-gpueff", "/var/spool/slurm-gpueff", "/run/slurm-gpueff"]
UNITS = ("gpueff-serve", "gpueff-agent", "gpueff-forward")
BLOCK = re.compile(r"<!-- site: ([\w-]+) -->\n```(\w+)\n(.*?)```", re.S)
SHIM = """#!/bin/sh
# systemctl where systemd does not run (tests/site): `enable [--now] UNIT...` / `start UNIT...` start the
# unit's ExecStart with its Environment, detached; its pid and output under $SHIM_STATE; `stop UNIT...` ends it.
set -eu
state=${SHIM_STATE:?}
mkdir -p "$state"
cmd=$1; shift
now=0
[ "${1:-}" = "--now" ] && { now=1; shift; }
for unit in "$@"; do
  u=${unit%.service}; f=/etc/systemd/system/$u.service
  [ -f "$f" ] || { echo "Unit $u.service not found." >&2; exit 5; }
  if [ "$cmd" = stop ]; then  # SIGTERM to the unit's process group, then wait for it to end (at most 60 s)
    pid=$(cat "$state/$u.pid" 2>/dev/null) || continue
    kill -TERM "-$pid" 2>/dev/null || true
    n=0; while kill -0 "-$pid" 2>/dev/null; do
      n=$((n+1)); [ $n -lt 600 ] || { echo "$u did not stop" >&2; exit 1; }; sleep 0.1
    done
    rm -f "$state/$u.pid"; continue
  fi
  case $cmd in enable) [ $now = 1 ] || continue ;; start) ;; *) echo "shim: $cmd unsupported" >&2; exit 1 ;; esac
  envs=$(sed -n 's/^Environment=//p' "$f"); exe=$(sed -n 's/^ExecStart=//p' "$f")
  env $envs setsid sh -c "exec $exe" >> "$state/$u.log" 2>&1 < /dev/null &
  echo $! > "$state/$u.pid"
done
"""


GUIDES = [os.path.join(ROOT, "docs", name) for name in ("site-guide.md", "operations.md")]
PG_MARK = "made by the gpueff site test"  # the comment on the PostgreSQL database the guide's steps make


def guide_blocks() -> dict[str, list[tuple[str, str]]]:
    """ROLE -> [(language, text)] of the marked blocks of the site guide, then of the operations guide (the
    move to PostgreSQL), in order."""
    text = ""
    for path in GUIDES:
        with open(path) as fh:
            text += fh.read()
    out: dict[str, list[tuple[str, str]]] = {}
    for role, lang, body in BLOCK.findall(text):
        out.setdefault(role, []).append((lang, body))
    return out


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    raise TypeError(v)


def edit_config(path: str, edits: dict[str, dict[str, Any]]) -> None:
    """Set ``section.key = value`` in the annotated config in place, as an admin edits it."""
    with open(path) as fh:
        lines = fh.read().splitlines()
    for section, keys in edits.items():
        for key, value in keys.items():
            line = f"{key} = {toml_value(value)}"
            try:
                start = lines.index(f"[{section}]")
            except ValueError:
                lines += ["", f"[{section}]", line]
                continue
            end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
            hit = next((i for i in range(start + 1, end) if re.match(rf"{re.escape(key)}\s*=", lines[i])), None)
            if hit is None:
                lines.insert(start + 1, line)
            else:
                lines[hit] = line
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    with open(path, "rb") as fh:
        tomllib.load(fh)


class Site:
    def __init__(self, base: str):
        self.base = base
        self.src = os.path.join(base, "src")
        self.cluster = base  # the Slurm cluster's directory, bind-mounted at the same path in the chroot
        self.bin = os.path.join(self.cluster, "bin")
        self.host = subprocess.run(["hostname", "-s"], capture_output=True, text=True, check=True).stdout.strip()
        self.blocks = guide_blocks()
        self.login_etc = os.path.join(base, "login-etc")  # the login node's /etc/slurm-gpueff
        self.started_munged = False
        self.made_units_dir: list[str] = []
        # the host's CA bundle, for pip in the chroot (a site's proxy CA lives there, not in pip's certifi)
        ca = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or "/etc/ssl/certs/ca-certificates.crt"
        self.ca = ca if os.path.isfile(ca) else ""

    def env(self, where: str, build: bool = False, offline: bool = False) -> dict[str, str]:
        """The environment of a block: the system PATH with the systemctl stand-in (for the build, the test's
        Python first: any Python with pip builds the wheel). ``offline``: pip reads no config file (none of
        this machine's indexes or wheel folders) and is given none."""
        env = {"PATH": f"{os.path.dirname(sys.executable)}:{SYS_PATH}" if build else f"{self.base}/shim:{SYS_PATH}",
               "HOME": "/root", "LANG": "C.UTF-8", "SHIM_STATE": f"{self.base}/units-{where}"}
        if offline:
            return {**env, "PIP_CONFIG_FILE": os.devnull}
        for k in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT", "http_proxy", "https_proxy"):
            if k in os.environ:
                env[k] = os.environ[k]
        if self.ca:
            env["PIP_CERT"] = self.ca if where == "host" else "/etc/ssl/certs/gpueff-site-ca.crt"
        return env

    def run_block(self, role: str, where: str, *, user: str | None = None, timeout: float = 600,
                  check: bool = True, etc: str = ETC, config: str = "") -> subprocess.CompletedProcess[str]:
        """Every ``sh`` block of ROLE, as written, with bash -e in the checkout: on the host, or in the chroot.
        ``etc``: the folder that stands for /etc/slurm-gpueff; ``config``: GPUEFF_CONFIG, where given."""
        script = "set -e\n" + "".join(body for lang, body in self.blocks[role] if lang == "sh")
        script = script.replace(ETC + "/", etc + "/")
        env = self.env(where, build=role == "build", offline=role == "every-offline")
        if config:
            env["GPUEFF_CONFIG"] = config
        if where == "node":
            argv = ["chroot", CHROOT, "env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-c",
                    f"cd {self.src} && {script}"]
        elif user:
            argv = ["runuser", "-u", user, "--", "env", "-i", *(f"{k}={v}" for k, v in env.items()
                                                               if k not in ("HOME", "SHIM_STATE")),
                    "bash", "-c", script]
        else:
            argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", "-c", script]
        p = subprocess.run(argv, cwd=self.src if not user else "/tmp", capture_output=True, text=True,
                           timeout=timeout)
        if check:
            assert p.returncode == 0, f"site guide block {role} ({where}) exited {p.returncode}:\n{script}\n" \
                                      f"--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-4000:]}"
        return p

    def config_edits(self, where: str, smtp_port: int) -> dict[str, dict[str, Any]]:
        """The guide's TOML block with its example host name made this host's (``api_listen`` in the service
        host's file only, as it says), and the test site's values."""
        (lang, body), = self.blocks["config"]
        assert lang == "toml"
        edits: dict[str, dict[str, Any]] = tomllib.loads(body.replace("gpueff.example.org", self.host))
        edits["site"]["cluster"] = CLUSTER
        if where in ("node", "login"):
            del edits["service"]["api_listen"]
        if where == "node":
            edits["collector"] = {"backend": "simulated"}
        if where != "host":
            return edits
        edits["sacct"] = {"command": f"{self.bin}/sacct", "settle_s": 8.0}
        edits["service"].update(ingest_interval_s=2.0, enrich_interval_s=4.0, rollup_interval_s=4.0,
                                cards_interval_s=0.0, metrics_port=0)
        edits["mail"] = {"host": "127.0.0.1", "port": smtp_port, "from_address": "gpueff@example.org"}
        edits["reports"] = {"address_pattern": "{user}@example.org", "admins": ["hpc-admins@example.org"],
                            "coordinators_as_leads": False}
        edits["leads"] = {ACCOUNT: [LEAD]}
        return edits

    def in_chroot(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["chroot", CHROOT, "env", "-i", f"PATH={SYS_PATH}", *argv], capture_output=True,
                              text=True, timeout=120, check=check)

    def slurm(self, *argv: str, user: str | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [f"{self.bin}/{argv[0]}", *argv[1:]]
        if user:
            cmd = ["runuser", "-u", user, "--", *cmd]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd="/tmp", check=False)


def refuse_foreign_install() -> None:
    for root in ("", CHROOT):
        for path in (OPT, ETC):
            if os.path.exists(root + path) and not os.path.exists(os.path.join(root + path, ".gpueff-site-test")):
                pytest.fail(f"{root + path} exists and was not made by this test: it will not touch an install")


def psql(sql: str, db: str = "postgres") -> str:
    """``sql`` on the host's PostgreSQL server as its postgres account (the guide's way in): its rows' text."""
    p = subprocess.run(["runuser", "-u", "postgres", "--", "psql", "-qAtX", "-d", db, "-c", sql], capture_output=True,
                       text=True, timeout=60, cwd="/tmp")
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def pg_made_here() -> dict[str, bool]:
    """Whether the guide's database and role (both "gpueff") exist, each: True when this test made it."""
    got = {}
    for kind, catalog, table, column in (("database", "pg_database", "pg_database", "datname"),
                                         ("role", "pg_authid", "pg_roles", "rolname")):
        found = psql(f"SELECT coalesce(shobj_description(oid, '{catalog}'), '-') FROM {table} "
                     f"WHERE {column} = 'gpueff'")
        if found:
            got[kind] = found == PG_MARK
    return got


def drop_pg_if_ours() -> None:
    """The guide's PostgreSQL database and role, gone if this test made them (also a killed run's); a database
    or role of that name that someone else made stops the test before it touches anything."""
    made = pg_made_here()
    if not all(made.values()):
        pytest.fail(f"PostgreSQL {', '.join(k for k, ours in made.items() if not ours)} 'gpueff' exists and was not "
                    "made by this test: it will not touch it")
    if made.get("database"):
        psql("DROP DATABASE gpueff WITH (FORCE)")
    if made.get("role"):
        psql("DROP ROLE gpueff")


def mark_ours(root: str) -> None:
    for path in (OPT, ETC):
        os.makedirs(root + path, exist_ok=True)
        Path(root + path, ".gpueff-site-test").touch()


def ensure_host_munged(site: Site) -> None:
    if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
        return
    if not os.path.exists("/etc/munge/munge.key"):
        subprocess.run(["mungekey", "--create", "--keyfile=/etc/munge/munge.key"], check=True)
    subprocess.run("chown munge:munge /etc/munge/munge.key && chmod 600 /etc/munge/munge.key && mkdir -p /run/munge "
                   "&& chown munge:munge /run/munge && chmod 755 /run/munge && rm -f /run/munge/munge.socket.2*",
                   shell=True, check=True)
    subprocess.run(["runuser", "-u", "munge", "--", "/usr/sbin/munged"], check=True)
    site.started_munged = True
    for _ in range(100):
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    raise RuntimeError("munged did not start on the host")


@pytest.fixture
def site() -> Iterator[Site]:
    if os.geteuid() != 0:
        pytest.fail("the site test installs into /opt, /etc and a Slurm chroot: run it as root (CI does)")
    refuse_foreign_install()
    drop_pg_if_ours()
    base = tempfile.mkdtemp(prefix="gpueff-site-", dir="/tmp")
    os.chmod(base, 0o755)
    s = Site(base)
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-co", "--exclude-standard"], capture_output=True,
                           text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(s.src, f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(s.src, f))
    os.makedirs(os.path.join(base, "shim"))
    with open(os.path.join(base, "shim", "systemctl"), "w") as fh:
        fh.write(SHIM)
    os.chmod(os.path.join(base, "shim", "systemctl"), 0o755)
    for root in ("", CHROOT):
        d = root + "/etc/systemd/system"
        if not os.path.isdir(d):
            os.makedirs(d)
            s.made_units_dir.append(d)
    # The chroot sees this directory at the same path (the cluster's start script keeps a mount it finds),
    # so the GPU nodes' steps run in the same checkout, and the systemctl stand-in is on their PATH too.
    mnt = CHROOT + base
    os.makedirs(mnt)
    subprocess.run(["mount", "--bind", base, mnt], check=True)
    try:
        yield s
    finally:
        for where in ("host", "node"):
            state = os.path.join(base, f"units-{where}")
            for unit in UNITS:
                pidfile = os.path.join(state, f"{unit}.pid")
                if os.path.exists(pidfile):
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.killpg(int(Path(pidfile).read_text()), signal.SIGTERM)
        time.sleep(1)
        drop_pg_if_ours()
        stop = [os.path.join(ROOT, "tests", "slurm", "chroot", "stop-slurm-chroot.sh"), "sid", "--purge"]
        subprocess.run(stop, env=dict(os.environ, BASE=s.cluster), capture_output=True, timeout=300)
        subprocess.run(["umount", mnt], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(mnt)
        for root in ("", CHROOT):
            for path in INSTALLED:
                shutil.rmtree(root + path, ignore_errors=True)
            for name in ("seff-gpu", "gpueff"):
                link = f"{root}/usr/local/bin/{name}"
                if os.path.islink(link) and os.readlink(link).startswith(OPT):
                    os.unlink(link)
            for unit in UNITS:
                for f in (f"{root}/etc/systemd/system/{unit}.service",
                          f"{root}/etc/systemd/system/multi-user.target.wants/{unit}.service"):
                    if os.path.lexists(f):
                        os.unlink(f)
        for d in s.made_units_dir:
            shutil.rmtree(d, ignore_errors=True)
        ca = f"{CHROOT}/etc/ssl/certs/gpueff-site-ca.crt"
        if os.path.exists(ca):
            os.unlink(ca)
        if s.started_munged:
            subprocess.run("kill $(cat /run/munge/munged.pid)", shell=True, capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def wait(cond, what: str, timeout: float = 180, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


def test_the_site_guide_installs_a_working_site(site, smtp_server):
    inbox, smtp_port = smtp_server
    blocks = site.blocks
    assert set(blocks) == {"debian", "build", "wheelhouse", "every", "every-offline", "config-service", "config-node",
                           "config-login", "config", "service", "node", "login", "postgres", "postgres-password",
                           "postgres-config", "move-stop", "move-copy", "move-start"}, sorted(blocks)
    t0 = time.monotonic()
    timings: dict[str, float] = {}

    def step(name: str) -> None:
        timings[name] = time.monotonic() - t0

    # before: python3-venv, on the host and on the nodes
    site.run_block("debian", "host")
    site.in_chroot("bash", "-c", blocks["debian"][0][1])
    # 1. the wheel, on the host
    site.run_block("build", "host")
    step("wheel")
    # the GPU nodes' OS: the host's munge key (one key per cluster) and its CA bundle (for pip)
    ensure_host_munged(site)
    shutil.copy("/etc/munge/munge.key", f"{CHROOT}/etc/munge/munge.key")
    site.in_chroot("chown", "munge:munge", "/etc/munge/munge.key")
    if site.ca:
        shutil.copy(site.ca, f"{CHROOT}/etc/ssl/certs/gpueff-site-ca.crt")
    # 2.-4. the service host (and login node): the package from a wheelhouse alone, its config, the service
    mark_ours("")
    site.run_block("wheelhouse", "host")
    site.run_block("every-offline", "host")
    site.run_block("config-service", "host")
    edit_config(f"{ETC}/gpueff.toml", site.config_edits("host", smtp_port))
    site.run_block("service", "host")
    step("service host")
    # 5. the GPU nodes, inside the chroot: the package and config first, then Slurm starts with their hooks
    mark_ours(CHROOT)
    site.run_block("every", "node")
    site.run_block("config-node", "node")
    edit_config(f"{CHROOT}{ETC}/gpueff.toml", site.config_edits("node", smtp_port))
    # the cluster: Slurm 26.05, two nodes, the guide's Prolog/Epilog (installed in the chroot above)
    prolog, epilog = f"{OPT}/venv/bin/gpueff-prolog", f"{OPT}/venv/bin/gpueff-epilog"
    env = dict(os.environ, BASE=site.cluster, PROLOG=prolog, EPILOG=epilog, HOOKS_IN_CHROOT="1", NNODES="2",
               CLUSTER=CLUSTER, ACCOUNT=ACCOUNT, TEST_USERS="alice bob")
    started = subprocess.run([os.path.join(ROOT, "tests", "slurm", "chroot", "start-slurm-chroot.sh"), "sid"],
                             env=env, capture_output=True, text=True, timeout=600)
    assert started.returncode == 0, started.stdout + started.stderr
    step("slurm up")
    node = site.run_block("node", "node", check=False)
    assert "FAIL" not in node.stdout and node.returncode == 0, node.stdout + node.stderr
    assert re.search(r"PASS\s+api\b", node.stdout), node.stdout  # the push target answers
    step("gpu nodes")
    # 6. the login role: its own file, then doctor as alice
    os.makedirs(site.login_etc, mode=0o755)
    site.run_block("config-login", "host", etc=site.login_etc)
    login_config = f"{site.login_etc}/gpueff.toml"
    edit_config(login_config, site.config_edits("login", smtp_port))
    login = site.run_block("login", "host", user="alice", check=False, config=login_config)
    assert login.returncode == 0 and "FAIL" not in login.stdout, login.stdout + login.stderr

    # jobs by alice and bob, one on each node
    jobs = {}
    for user, node_name in (("alice", site.host), ("bob", f"{site.host}-2")):
        p = site.slurm("sbatch", "--parsable", "-w", node_name, "--gres=gpu:1", "-o", "/dev/null",
                       "--wrap", "sleep 4", user=user)
        assert p.returncode == 0, p.stderr
        jobs[user] = int(p.stdout.strip().split(";")[0])
    wait(lambda: not site.slurm("squeue", "-h", "-j", ",".join(map(str, jobs.values()))).stdout.strip(),
         "the jobs to end", 120)
    step("jobs ran")

    # the records reach the service from the nodes and are enriched from Slurm's accounting
    def card(user: str, job: int) -> dict[str, Any] | None:
        p = subprocess.run(["seff-gpu", "--json", str(job)], capture_output=True, text=True,
                           env={"PATH": SYS_PATH, "LANG": "C.UTF-8"}, timeout=60)
        if p.returncode != 0:
            return None
        got = json.loads(p.stdout)["jobs"][0]["job"]
        return got if got["state"] == "COMPLETED" and not got["state_pending"] else None

    def stored(job: int, user: str, what: str) -> None:
        """Wait for the job's card, COMPLETED and accounted; the services' logs and seff-gpu's answer if not."""
        try:
            c = wait(lambda: card(user, job), f"{user}'s job {job} {what}", 180)
        except AssertionError as exc:
            logs = {u: Path(f"{site.base}/units-{w}/{u}.log").read_text()[-3000:]
                    for w, u in (("host", "gpueff-serve"), ("node", "gpueff-forward"))}
            last = subprocess.run(["seff-gpu", "--json", str(job)], capture_output=True, text=True,
                                  env={"PATH": SYS_PATH, "LANG": "C.UTF-8"}, timeout=60)
            raise AssertionError(f"{exc}\n{logs}\nseff-gpu: exit {last.returncode}: {last.stdout[-2000:]}"
                                 f"{last.stderr}") from None
        assert c["user"] == user, c

    for user, job in jobs.items():
        stored(job, user, "stored and accounted")
    step("stored + enriched")

    # alice on the login role: her job's card, not bob's
    def seff_as(user: str, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", user, "--", "env", "-i", f"PATH={SYS_PATH}", "LANG=C.UTF-8",
                               f"GPUEFF_CONFIG={login_config}", "seff-gpu", *args], capture_output=True, text=True,
                              timeout=60, cwd="/tmp")

    mine = seff_as("alice", str(jobs["alice"]))
    assert mine.returncode == 0, mine.stdout + mine.stderr
    assert f"Job ID: {jobs['alice']}" in mine.stdout or str(jobs["alice"]) in mine.stdout, mine.stdout
    assert "alice" in mine.stdout and "simulated" in mine.stdout.lower(), mine.stdout
    theirs = seff_as("alice", str(jobs["bob"]))
    assert theirs.returncode in (3, 6), theirs.stdout + theirs.stderr
    assert "bob" not in theirs.stdout + theirs.stderr, theirs.stdout + theirs.stderr
    # the nodes hold no database credentials, and their records came by push, signed by root
    for path in (f"{CHROOT}{ETC}/gpueff.toml", login_config):
        with open(path, "rb") as fh:
            paths = tomllib.load(fh).get("paths", {})
        assert "database" not in paths and "database_password_file" not in paths, (path, paths)
    assert "push credentials" not in node.stdout, node.stdout
    serve_log = Path(f"{site.base}/units-host/gpueff-serve.log").read_text()
    assert re.search(r"uid 0 node \S+: \d+ records, stored [1-9]", serve_log), serve_log[-3000:]

    # the monthly summary, through the loopback SMTP server
    month = datetime.now(UTC).strftime("%Y-%m")
    p = subprocess.run(["gpueff", "report", "monthly", "--month", month], capture_output=True, text=True,
                       env={"PATH": SYS_PATH, "LANG": "C.UTF-8", "HOME": "/root"}, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    rcpts = {r for tos, _msg in inbox.messages for r in tos}
    assert {f"{LEAD}@example.org", "hpc-admins@example.org"} <= rcpts, (rcpts, p.stdout)
    step("monthly sent")

    # the move to PostgreSQL, as the guides write it: the role and database, the service stopped, the password
    # file, the config, the history copied, the service started again
    site.run_block("postgres", "host")
    psql(f"COMMENT ON DATABASE gpueff IS '{PG_MARK}'; COMMENT ON ROLE gpueff IS '{PG_MARK}'")
    site.run_block("move-stop", "host")
    site.run_block("postgres-password", "host")
    (lang, body), = blocks["postgres-config"]
    assert lang == "toml"
    edit_config(f"{ETC}/gpueff.toml", tomllib.loads(body.replace("@dbhost/", "@127.0.0.1/")))
    moved = site.run_block("move-copy", "host")
    assert "row counts equal in every table" in moved.stdout, moved.stdout
    started = site.run_block("move-start", "host", check=False)
    assert started.returncode == 0 and "FAIL" not in started.stdout, started.stdout + started.stderr
    assert re.search(r"PASS\s+database schema\b", started.stdout), started.stdout
    # the moved site: the history is there, and a new job goes into PostgreSQL through the nodes' push
    p = site.slurm("sbatch", "--parsable", "-w", site.host, "--gres=gpu:1", "-o", "/dev/null", "--wrap", "sleep 2",
                   user="alice")
    assert p.returncode == 0, p.stderr
    after = int(p.stdout.strip().split(";")[0])
    stored(after, "alice", "stored in PostgreSQL and accounted")
    for job in (jobs["alice"], after):
        mine = seff_as("alice", str(job))
        assert mine.returncode == 0 and f"Job ID: {job}" in mine.stdout, mine.stdout + mine.stderr
    assert psql("SELECT count(*) FROM job", db="gpueff") == "3"
    step("moved to PostgreSQL")
    sys.stderr.write("\n[site] " + ", ".join(f"{k} at {v:.0f} s" for k, v in timings.items()) + "\n")
