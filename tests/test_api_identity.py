"""The service proves who it is: an ordinary user who binds the API's port while ``gpueff serve`` is down
gets nothing readable from a user's request, cannot pass off an answer, and cannot use the request later.

Everything is real: a private munged, ``gpueff serve`` processes, ``seff-gpu`` run as the ordinary user
gpuser (the victim) with Debian's python3 and a copy of the package, and the squatter, a real program
(tests/squatter.py) run as the user ``nobody``. Two hosts: this network namespace is the login node, and
a network namespace of its own (``ip netns``, a veth pair) is the service host, where the squatter binds the
service's address while the service is down; the login node's kernel cannot see who listens there, so only
the sealed answer can tell. On the same host the kernel names the squatter before anything is sent.
"""

from __future__ import annotations

import os
import pathlib
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from daemons import free_port, start_munged
from sites import sim_record, site_config, spool_records

from slurm_gpueff import spool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VICTIM, SQUATTER = "gpuser", "nobody"
SYS_PYTHON = "/usr/bin/python3"
JOB = 7002

pytestmark = [pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("munged") or not shutil.which("ip") or not os.path.exists(SYS_PYTHON)
    or subprocess.run(["id", VICTIM], capture_output=True).returncode != 0,
    reason="needs root, MUNGE, iproute2, /usr/bin/python3 and the user gpuser"), pytest.mark.process]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


@pytest.fixture(scope="module")
def site():
    base = tempfile.mkdtemp(prefix="gpueff-ident-", dir="/tmp")
    os.chmod(base, 0o755)
    ns, n = f"gpueff-svc-{os.getpid()}", os.getpid() % 200 + 20
    veth = f"gpv{os.getpid() % 100000}"
    procs: list[subprocess.Popen] = []
    try:
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", f"{veth}s")
        sh("ip", "link", "set", f"{veth}s", "netns", ns)
        sh("ip", "addr", "add", f"10.{n}.0.1/24", "dev", veth)
        sh("ip", "link", "set", veth, "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.{n}.0.2/24", "dev", f"{veth}s")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", f"{veth}s", "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        munged, sock = start_munged(base, "munge")
        procs.append(munged)
        lib = os.path.join(base, "pylib")  # the victim's and the squatter's Python: Debian's, and this package
        shutil.copytree(os.path.join(ROOT, "slurm_gpueff"), os.path.join(lib, "slurm_gpueff"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(os.path.join(ROOT, "tests", "squatter.py"), lib)
        subprocess.run(["chmod", "-R", "a+rX", lib], check=True)
        db_dir = os.path.join(base, "db")
        os.makedirs(db_dir, mode=0o755)
        db = os.path.join(db_dir, "gpueff.db")
        port = free_port()
        quiet = "".join(f"{k} = 0\n" for k in ("ingest_interval_s", "enrich_interval_s", "rollup_interval_s",
                                               "rollup_full_interval_s", "retention_interval_s", "cards_interval_s"))
        common = f'[sacct]\ncommand = "{base}/bin/sacct"\n'
        cfgs = {}
        for name, service in (("remote", f'api_listen = "10.{n}.0.2:{port}"\n'),
                              ("local", f'api_listen = "127.0.0.1:{port}"\n')):
            cfgs[name] = str(site_config(pathlib.Path(base), pathlib.Path(db), name=f"{name}.toml", extra=(
                common + f'[service]\nmetrics_port = 0\n{quiet}{service}munge_socket = "{sock}"\n')))
            os.chmod(cfgs[name], 0o644)
        os.makedirs(os.path.join(base, "bin"))
        env = dict(os.environ, PYTHONPATH=ROOT, PATH=f"{base}/bin:/usr/bin:/bin")
        env.pop("GPUEFF_CONFIG", None)
        spool.ensure_dirs(f"{base}/spool")
        uid = pwd.getpwnam(VICTIM).pw_uid
        spool_records(f"{base}/spool", [sim_record(JOB, user=VICTIM, uid=uid, account="vision")])
        subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", cfgs["local"], "ingest"],
                       env=env, check=True, capture_output=True, timeout=120)
        os.chmod(db, 0o600)
        yield {"base": base, "ns": ns, "addr": f"10.{n}.0.2:{port}", "port": port, "cfg": cfgs, "env": env,
               "lib": lib, "sock": sock, "victim_uid": uid, "procs": procs}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
                p.wait(10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def squat(site, where: str, mode: str, netns: bool, victim: int | None = None) -> tuple[subprocess.Popen, str]:
    """The squatter (as nobody) listening on ``where``, in the service host's namespace or this one, sealing its
    answers for ``victim`` (default gpuser); its folder."""
    out = tempfile.mkdtemp(prefix="squat-", dir=site["base"])
    shutil.chown(out, SQUATTER)
    sealed_for = site["victim_uid"] if victim is None else victim
    argv = ["runuser", "-u", SQUATTER, "--", "env", f"PYTHONPATH={site['lib']}", f"GPUEFF_MUNGE_SOCKET={site['sock']}",
            SYS_PYTHON, f"{site['lib']}/squatter.py", "listen", where, out, mode, str(sealed_for)]
    p = subprocess.Popen(["ip", "netns", "exec", site["ns"], *argv] if netns else argv)
    site["procs"].append(p)
    for _ in range(200):
        if os.path.exists(f"{out}/listening"):
            return p, out
        time.sleep(0.05)
    raise RuntimeError("the squatter did not listen")


def seff(site, cfg: str, *args: str) -> subprocess.CompletedProcess:
    """seff-gpu as the victim, on the login node (this namespace), reaching the service at its api_listen."""
    env = {"PATH": "/usr/bin:/bin", "HOME": site["base"], "LANG": "C.UTF-8", "PYTHONPATH": site["lib"]}
    return subprocess.run(["runuser", "-u", VICTIM, "--", "env", *(f"{k}={v}" for k, v in env.items()), SYS_PYTHON,
                           "-m", "slurm_gpueff.cli.seff", "--config", site["cfg"][cfg], *args], capture_output=True,
                          text=True, timeout=60, cwd=site["base"])


def serve(site, cfg: str, netns: bool) -> subprocess.Popen:
    log = open(os.path.join(site["base"], f"serve-{cfg}.log"), "a")  # noqa: SIM115 - the process keeps it
    argv = [sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", site["cfg"][cfg], "serve"]
    p = subprocess.Popen(["ip", "netns", "exec", site["ns"], *argv] if netns else argv, env=site["env"], stdout=log,
                         stderr=subprocess.STDOUT)
    site["procs"].append(p)
    return p


def test_a_squatter_on_the_service_host_gets_nothing_readable_and_cannot_pass_off_or_replay(site):
    where = site["addr"]
    expect = f"seff-gpu: the process at {where} is not the gpueff service"
    # 1. The service is down; nobody binds its port on the service host and answers with a card of their own,
    # sealed by themselves for the victim, for this very request.
    squatter, out = squat(site, where, "sealed", netns=True)
    p = seff(site, "remote", str(JOB))
    squatter.wait(20)
    assert p.returncode == 1 and p.stdout == "", (p.stdout, p.stderr)
    assert p.stderr == f"{expect} (uid 65534 (nobody), expected root); nothing it said is used. Tell the site's " \
                       "administrators\n", p.stderr
    request = pathlib.Path(out, "request.bin").read_bytes()
    assert b"Authorization: MUNGE MUNGE:" in request and b'"jobid"' not in request  # the query itself is sealed
    # 2. ... or with a plain card: not sealed, not taken
    squatter2, out2 = squat(site, where, "plain", netns=True)
    p = seff(site, "remote", str(JOB))
    squatter2.wait(20)
    assert p.returncode == 1 and p.stderr == f"{expect} (its answer is not sealed by root); nothing it said is " \
                                             "used\n", p.stderr
    assert "made up" not in p.stdout
    # 3. While it holds the port, the service cannot start, and says who holds it.
    squatter3, _ = squat(site, where, "silent", netns=True)
    q = subprocess.run(["ip", "netns", "exec", site["ns"], sys.executable, "-m", "slurm_gpueff.cli.gpueff",
                        "--config", site["cfg"]["remote"], "serve"], env=site["env"], capture_output=True, text=True,
                       timeout=60)
    assert q.returncode == 1 and "Traceback" not in q.stderr, q.stderr
    assert re.fullmatch(rf"gpueff: cannot listen on \[service\] api_listen = {re.escape(where)}: the port is held by "
                        r"uid 65534 \(nobody\), pid \d+ \(python3\)", q.stderr.splitlines()[-1]), q.stderr
    squatter3.kill()
    squatter3.wait(10)
    # 4. The real service is back. The squatter relays the victim's kept request: the service answers it, once,
    # sealed for the victim, and the squatter cannot open it; sent again, it is refused as replayed.
    server = serve(site, "remote", netns=True)
    try:
        relay = ["runuser", "-u", SQUATTER, "--", "env", f"PYTHONPATH={site['lib']}",
                 f"GPUEFF_MUNGE_SOCKET={site['sock']}", SYS_PYTHON, f"{site['lib']}/squatter.py", "relay",
                 f"http://{where}", out]
        for _ in range(100):
            r = subprocess.run(relay, capture_output=True, text=True, timeout=60)
            if r.returncode == 0:
                break
            time.sleep(0.2)  # the service still starting
        assert r.returncode == 0, r.stderr
        first = pathlib.Path(out, "reply-1.bin").read_bytes()
        assert first.startswith(b"HTTP/1.1 200 ") and b"\r\nGpueff-Seal: MUNGE:" in first, first[:300]
        assert b"Job ID" not in first and VICTIM.encode() not in first and b"vision" not in first
        opened = pathlib.Path(out, "opened").read_text()
        assert opened.startswith("18\n") and "Unauthorized credential" in opened, opened
        second = pathlib.Path(out, "reply-2.bin").read_bytes()
        assert second.startswith(b"HTTP/1.1 401 ") and b"replayed credential" in second, second[:300]
        # 5. The victim, asking the real service, gets the card.
        p = seff(site, "remote", str(JOB))
        assert p.returncode == 0 and f"Job ID: {JOB}" in p.stdout and f"User/Account: {VICTIM}/vision" in p.stdout, \
            p.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0


def test_a_squatter_on_the_same_host_is_named_before_anything_is_sent(site):
    where = f"127.0.0.1:{site['port']}"
    squatter, out = squat(site, where, "sealed", netns=False)
    p = seff(site, "local", str(JOB))
    squatter.wait(20)
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr == f"seff-gpu: the process at {where} is not the gpueff service (uid 65534 (nobody), expected " \
                       "root); nothing was sent to it. Tell the site's administrators\n", p.stderr
    assert pathlib.Path(out, "request.bin").read_bytes() == b""  # it got a connection, and not one byte
    # gpueff doctor on this host says the same
    squatter2, _ = squat(site, where, "silent", netns=False)
    try:
        d = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", site["cfg"]["local"], "doctor",
                            "--role", "login"], env=site["env"], capture_output=True, text=True, timeout=60)
        assert d.returncode == 1 and f"the process at {where} is not the gpueff service (uid 65534 (nobody)" in d.stdout
    finally:
        squatter2.kill()
        squatter2.wait(10)


def test_a_node_keeps_its_records_when_a_squatter_acknowledges_them(site):
    """A node deletes a record only on the service's sealed acknowledgement: a squatter on the service host that
    "acknowledges" the records by their (guessable) names, sealed by itself for root, is refused by name, and
    the records stay in the node's spool for the real service."""
    node_spool = os.path.join(site["base"], "node-spool")
    spool.ensure_dirs(node_spool)
    path = spool.write_record(node_spool, sim_record(7003, user=VICTIM, uid=site["victim_uid"], account="vision"))
    name = os.path.basename(path)
    node_cfg = os.path.join(site["base"], "node.toml")
    with open(node_cfg, "w") as fh:
        fh.write(f'[site]\ncluster = "c"\n[paths]\nspool_dir = "{node_spool}"\nstate_dir = "{site["base"]}/nstate"\n'
                 f'[service]\napi_url = "http://{site["addr"]}"\nmunge_socket = "{site["sock"]}"\n')
    squatter, _ = squat(site, site["addr"], f"ack:{name}", netns=True, victim=0)
    faked = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", node_cfg,
                                          "forward", "--once"], env=site["env"], capture_output=True, text=True,
                                         timeout=60)
    squatter.wait(20)
    assert faked.returncode == 1, faked.stderr
    assert f"the process at {site['addr']} is not the gpueff service (uid 65534 (nobody), expected root)" in \
        faked.stderr + faked.stdout
    assert os.path.exists(path)  # kept
    server = serve(site, "remote", netns=True)
    try:
        for _ in range(100):
            done = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", node_cfg, "forward",
                                   "--once"], env=site["env"], capture_output=True, text=True, timeout=60)
            if done.returncode == 0:
                break
            time.sleep(0.2)  # the service still starting
        assert done.returncode == 0 and not os.path.exists(path), done.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(30) == 0
