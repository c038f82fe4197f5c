"""``seff-gpu`` through ``gpueff serve``'s API, with everything real: a private ``munged`` (its own key and
socket), two ``gpueff serve`` processes (the API on a Unix socket, and on a TCP port with an account lead
configured), a database made by ``gpueff ingest`` of simulated records and readable by root only, and
``seff-gpu`` run as the ordinary user ``gpuser`` through ``runuser``, with Debian's python3 and a copy of
the package alone: the service path needs nothing beyond the standard library.

Only Slurm is absent: no controller runs here, so the services find no ``sacct``/``sacctmgr``/``squeue`` (PATH
without them, and an absent ``[sacct] command``, also for seff-gpu's direct path), which leaves the
coordinators empty (logged) exactly as a failing sacctmgr does. Their ``scontrol`` is a stand-in printing the
``PrivateData`` line of ``scontrol show config`` (``none``: another user's job is refused, exit 6; ``jobs``
for the service that hides them), as the real one does on the clusters of tests/slurm/.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import pytest
from daemons import free_port, start_munged, wait_health
from sites import sim_record, site_config, spool_records

from slurm_gpueff import spool, statedir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER = "gpuser"
SYS_PYTHON = "/usr/bin/python3"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("munged") or not os.path.exists(SYS_PYTHON)
    or subprocess.run(["id", USER], capture_output=True).returncode != 0,
    reason="needs root, MUNGE, /usr/bin/python3 and the user gpuser")
pytestmark = [pytestmark, pytest.mark.process]  # munged, gpueff serve, seff-gpu as gpuser


GPUSER_UID = int(subprocess.run(["id", "-u", USER], capture_output=True, text=True).stdout.strip() or -1)
# job id -> (user, uid, account)
JOBS = {100: (USER, GPUSER_UID, "vision"), 101: (USER, GPUSER_UID, "physics"),
        200: ("root", 0, "vision"), 201: ("root", 0, "physics")}
NO_GPU_REASON = "SLURM_JOB_GPUS='gpu:weird' cannot be parsed"


class UnixConn(http.client.HTTPConnection):
    def __init__(self, path: str):
        super().__init__("localhost", timeout=10)
        self.path_ = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path_)


@pytest.fixture(scope="module")
def site():
    base = tempfile.mkdtemp(prefix="gpueff-api-", dir="/tmp")  # not under pytest's 0700 tmp: gpuser reads here
    os.chmod(base, 0o755)
    procs: list[subprocess.Popen] = []
    try:
        munged, sock = start_munged(base, "munge")
        other_munged, other_sock = start_munged(base, "munge-other-key")
        procs += [munged, other_munged]
        # gpuser's Python: Debian's python3 and this package, nothing else
        lib = os.path.join(base, "pylib")
        shutil.copytree(os.path.join(ROOT, "slurm_gpueff"), os.path.join(lib, "slurm_gpueff"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["chmod", "-R", "a+rX", lib], check=True)
        os.makedirs(os.path.join(base, "bin"))  # PATH of the services: no Slurm commands but scontrol's stand-in
        fake_scontrol(os.path.join(base, "bin"), "none")
        db_dir = os.path.join(base, "db")
        os.makedirs(db_dir, mode=0o755)
        db = os.path.join(db_dir, "gpueff.db")
        uds = os.path.join(base, "run", "api.sock")
        port = free_port()
        common = f'[sacct]\ncommand = "{base}/bin/sacct"\n'  # absent on both paths, as the services' PATH has none
        intervals = "".join(f"{k} = 0\n" for k in ("ingest_interval_s", "enrich_interval_s", "rollup_interval_s",
                                                   "rollup_full_interval_s", "retention_interval_s",
                                                   "cards_interval_s"))
        cfgs = {
            "unix": common + f'[service]\nmetrics_port = 0\n{intervals}api_listen = "unix:{uds}"\n'
                             f'munge_socket = "{sock}"\n',
            "tcp": common + '[privacy]\ncoordinators = false\n[leads]\nphysics = ["' + USER + '"]\n'
                            f'[service]\nmetrics_port = 0\n{intervals}api_listen = "0.0.0.0:{port}"\n'
                            f'munge_socket = "{sock}"\n',
            "munged-down": common + f'[service]\napi_listen = "unix:{uds}"\nmunge_socket = "{base}/nope.sock"\n',
            "none": common + "[service]\napi_listen = \"\"\n",
        }
        paths = {}
        for name, text in cfgs.items():
            paths[name] = str(site_config(pathlib.Path(base), pathlib.Path(db), extra=text, name=f"{name}.toml"))
            os.chmod(paths[name], 0o644)
        env = dict(os.environ, PYTHONPATH=ROOT, PATH=f"{base}/bin")
        env.pop("GPUEFF_CONFIG", None)
        env.pop("GPUEFF_SEFF_VIA", None)
        # the database: gpueff ingest of simulated records, then private to root
        spool.ensure_dirs(f"{base}/spool")
        spool_records(f"{base}/spool", [
            *(sim_record(job_id, user=user, uid=uid, account=account) for job_id, (user, uid, account) in JOBS.items()),
            sim_record(300, gpus=0, user=USER, uid=GPUSER_UID, account="vision", reason=NO_GPU_REASON)])
        subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", paths["unix"], "ingest"],
                       env=env, check=True, capture_output=True, timeout=120)
        os.chmod(db, 0o600)
        servers = {}
        for name, conn in (("unix", lambda: UnixConn(uds)),
                           ("tcp", lambda: http.client.HTTPConnection("127.0.0.1", port, timeout=10))):
            log = os.path.join(base, f"serve-{name}.log")
            with open(log, "w") as fh:
                p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", paths[name],
                                      "serve"], env=env, stdout=fh, stderr=subprocess.STDOUT)
            procs.append(p)
            wait_health(conn, p, log)
            servers[name] = (p, conn, log)
        yield {"base": base, "cfg": paths, "db": db, "lib": lib, "uds": uds, "port": port, "servers": servers,
               "munge_socket": sock, "other_munge_socket": other_sock, "env": env}
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        shutil.rmtree(base, ignore_errors=True)


def fake_scontrol(bin_dir: str, private_data: str | None) -> None:
    """``bin_dir``/scontrol: ``scontrol show config``'s PrivateData line (``none``, ``jobs,usage``...), or, with
    None, the failure of a scontrol that reaches no controller."""
    body = (f"printf 'PrivateData             = %s\\n' '{private_data}'" if private_data is not None else
            "echo 'slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)' >&2; exit 1")
    path = os.path.join(bin_dir, "scontrol")
    with open(path, "w") as fh:
        fh.write(f'#!/bin/sh\n[ "$1 $2" = "show config" ] || exit 2\n{body}\n')
    os.chmod(path, 0o755)


def seff(site, *args: str, cfg: str = "unix", as_user: str | None = USER, via: str | None = None,
         cwd: str | None = None) -> subprocess.CompletedProcess:
    """seff-gpu as gpuser (Debian's python3, the package copy), or as root with the test interpreter."""
    env = {"PATH": "/usr/bin:/bin", "HOME": site["base"], "LANG": "C.UTF-8"}
    if via:
        env["GPUEFF_SEFF_VIA"] = via
    if as_user:
        env["PYTHONPATH"] = site["lib"]
        argv = ["runuser", "-u", as_user, "--", "env", *(f"{k}={v}" for k, v in env.items()), SYS_PYTHON]
    else:
        env["PYTHONPATH"] = ROOT
        argv = ["env", "-i", *(f"{k}={v}" for k, v in env.items()), sys.executable]
    argv += ["-m", "slurm_gpueff.cli.seff", "--config", site["cfg"][cfg], *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=cwd or site["base"])


def post(site, body: bytes, authorization: str | None) -> tuple[int, str]:
    c = UnixConn(site["uds"])
    headers = {"Content-Type": "application/json"}
    if authorization is not None:
        headers["Authorization"] = authorization
    c.request("POST", "/v1/seff", body, headers)
    r = c.getresponse()
    return r.status, r.read().decode()


def credential(payload: str, sock: str) -> str:
    return subprocess.run(["munge", "--socket", sock, "--no-input", "--string", payload], capture_output=True,
                          text=True, check=True).stdout.strip()


def ids(table: str) -> set[int]:
    """The job ids a -u/-A table lists."""
    return {int(line.split()[0]) for line in table.splitlines() if line[:1].isdigit()}


def log_since(site, offset: int, server: str = "unix") -> str:
    """What the service wrote to its log after ``offset`` bytes: a test's own requests' lines."""
    with open(site["servers"][server][2], "rb") as fh:
        fh.seek(offset)
        return fh.read().decode("utf-8", "replace")


def one_line_error(p: subprocess.CompletedProcess, code: int) -> str:
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    assert p.stderr.count("\n") == 1 and p.stderr.startswith("seff-gpu: ") and "Traceback" not in p.stderr
    return p.stderr


def test_the_user_cannot_read_the_database_file(site):
    p = subprocess.run(["runuser", "-u", USER, "--", SYS_PYTHON, "-c", f"open({site['db']!r}, 'rb')"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "PermissionError" in p.stderr and "Permission denied" in p.stderr


def test_own_job_card_through_the_service(site):
    p = seff(site, "100")
    assert p.returncode == 0, p.stderr
    assert "Job ID: 100" in p.stdout and f"User/Account: {USER}/vision" in p.stdout and p.stderr == ""
    with open(site["servers"]["unix"][2]) as fh:
        log = fh.read()
    assert f"uid {GPUSER_UID} card exit 0 -> 200" in log
    assert "Healthy" not in log.split("api POST")[-1]  # log lines carry no job contents


def test_another_users_job_is_refused(site):
    err = one_line_error(seff(site, "200"), 6)
    assert "belongs to another user" in err and USER in err


def test_own_table_json_and_html(site, tmp_path):
    p = seff(site, "-u", USER, "-S", "2020-01-01", "-E", "2030-01-01")
    assert p.returncode == 0, p.stderr
    assert ids(p.stdout) == {100, 101, 300} and "Total (3 jobs)" in p.stdout
    p = seff(site, "--json", "101")
    assert p.returncode == 0, p.stderr
    assert [j["job"]["job_id"] for j in json.loads(p.stdout)["jobs"]] == [101]
    out = os.path.join(site["base"], "cards")
    os.makedirs(out, exist_ok=True)
    shutil.chown(out, USER)
    p = seff(site, "100", "--html", f"{out}/card.html")
    assert p.returncode == 0, p.stderr
    assert p.stderr == f"wrote {out}/card.html\n"
    assert os.stat(f"{out}/card.html").st_uid == GPUSER_UID  # written by the client, as the user
    with open(f"{out}/card.html") as fh:
        assert fh.read().lstrip().lower().startswith("<!doctype html")
    one_line_error(seff(site, "-u", "root", "-S", "2020-01-01", "-E", "2030-01-01"), 6)


def test_html_never_clobbers_a_file_nor_follows_a_link(site):
    """The issue's attack, as the ordinary user and as root: ``ln -s target.txt link.html; seff-gpu --html
    link.html 100`` rewrote target.txt. Now an existing name (a link, a file) is refused in one line, exit 2,
    nothing printed and nothing written; --force replaces the name itself (a link by a file), never a link's
    target."""
    d = os.path.join(site["base"], "clobber")
    os.makedirs(d)
    shutil.chown(d, USER)
    target, link, card = f"{d}/target.txt", f"{d}/link.html", f"{d}/card.html"
    for path, text in ((target, "precious\n"), (card, "old card\n")):
        with open(path, "w") as fh:
            fh.write(text)
        shutil.chown(path, USER)
    os.symlink("target.txt", link)
    os.lchown(link, GPUSER_UID, -1)
    for as_user in (USER, None):  # gpuser through the service; root on the direct path (where it writes anywhere)
        err = one_line_error(seff(site, "100", "--html", link, as_user=as_user), 2)
        assert err == f"seff-gpu: {link} exists (a symbolic link, not followed): not overwritten; --force " \
                      "replaces it\n", err
        err = one_line_error(seff(site, "100", "--html", card, as_user=as_user), 2)
        assert err == f"seff-gpu: {card} exists (a file): not overwritten; --force replaces it\n", err
        assert pathlib.Path(target).read_text() == "precious\n" and os.path.islink(link)
        assert pathlib.Path(card).read_text() == "old card\n"
    assert sorted(os.listdir(d)) == ["card.html", "link.html", "target.txt"]
    p = seff(site, "100", "--html", link, "--force")
    assert p.returncode == 0 and p.stderr == f"wrote {link}\n", p.stderr
    assert not os.path.islink(link) and os.stat(link).st_uid == GPUSER_UID
    assert pathlib.Path(link).read_text().lstrip().lower().startswith("<!doctype html")
    assert pathlib.Path(target).read_text() == "precious\n"
    p = seff(site, "100", "--html", card, "--force")
    assert p.returncode == 0 and pathlib.Path(card).read_text().lstrip().lower().startswith("<!doctype html")
    one_line_error(seff(site, "100", "--force"), 2)  # --force alone: a usage error
    assert sorted(os.listdir(d)) == ["card.html", "link.html", "target.txt"]


def test_a_lead_sees_the_accounts_jobs_and_not_others(site):
    assert seff(site, "201", cfg="tcp").returncode == 0  # root's job in physics, which gpuser leads there
    one_line_error(seff(site, "200", cfg="tcp"), 6)  # root's job in vision
    one_line_error(seff(site, "201", cfg="unix"), 6)  # the other service has no leads
    p = seff(site, "-A", "physics", "-S", "2020-01-01", "-E", "2030-01-01", cfg="tcp")
    assert p.returncode == 0, p.stderr
    assert ids(p.stdout) == {101, 201}
    p = seff(site, "-u", "root", "-A", "physics", "-S", "2020-01-01", "-E", "2030-01-01", cfg="tcp")
    assert p.returncode == 0 and ids(p.stdout) == {201}
    one_line_error(seff(site, "-u", "root", "-A", "vision", "-S", "2020-01-01", "-E", "2030-01-01", cfg="tcp"), 6)
    one_line_error(seff(site, "-A", "vision", "-S", "2020-01-01", "-E", "2030-01-01", cfg="tcp"), 6)  # not led
    p = seff(site, "-u", USER, "-A", "vision", "-S", "2020-01-01", "-E", "2030-01-01", cfg="tcp")
    assert p.returncode == 0 and ids(p.stdout) == {100, 300}  # one's own jobs in any account


@contextlib.contextmanager
def service_where_slurm_says(site, name: str, private_data: str | None):
    """Another ``gpueff serve`` of the same database and state directory, its API on its own Unix socket, whose
    ``scontrol`` prints ``PrivateData = <private_data>`` (None: fails, as with no controller); yields the name
    of gpuser's config for it in ``site["cfg"]``."""
    base = site["base"]
    bin_dir = os.path.join(base, f"bin-{name}")
    os.makedirs(bin_dir, exist_ok=True)
    fake_scontrol(bin_dir, private_data)
    uds = os.path.join(base, "run", f"api-{name}.sock")
    common = f'[sacct]\ncommand = "{bin_dir}/sacct"\n'  # absent; scontrol is taken from beside it
    intervals = "".join(f"{k} = 0\n" for k in ("ingest_interval_s", "enrich_interval_s", "rollup_interval_s",
                                               "rollup_full_interval_s", "retention_interval_s", "cards_interval_s"))
    server = str(site_config(pathlib.Path(base), pathlib.Path(site["db"]), name=f"server-{name}.toml",
                             extra=common + f'[service]\nmetrics_port = 0\n{intervals}api_listen = "unix:{uds}"\n'
                                            f'munge_socket = "{site["munge_socket"]}"\n'))
    client = str(site_config(pathlib.Path(base), pathlib.Path(site["db"]), name=f"client-{name}.toml",
                             extra=f'[service]\napi_url = "unix:{uds}"\nmunge_socket = "{site["munge_socket"]}"\n'))
    os.chmod(client, 0o644)
    site["cfg"][name] = client
    log = os.path.join(base, f"serve-{name}.log")
    with open(log, "w") as fh:
        p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", server, "serve"],
                             env=site["env"], stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_health(lambda: UnixConn(uds), p, log)
        yield name, log
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0


def test_another_users_job_is_no_such_job_where_slurm_hides_jobs(site):
    """Where Slurm's PrivateData includes jobs, "not yours" (exit 6) would tell any user which job ids exist,
    running ones included: there another user's job, finished or running on the service host, gets exactly the
    answer of a job that does not exist (exit status, stdout, stderr, with or without --json). The same where
    scontrol cannot answer (the safe side), which the service's log says once. Elsewhere, exit 6 as before.
    gpuser through real services with a real munged; root's job 200 is in the database, root's job 8200 runs on
    the service host (its Prolog state), 999 and 8201 exist nowhere."""
    from slurm_gpueff import jobstate

    jobstate.save(statedir.job(os.path.join(site["base"], "run"), 8200),
                  {"start_time": time.time() - 60, "job": {"job_id": 8200, "user": "root", "uid": 0,
                                                          "account": "vision"}})
    try:
        for args in (["200"], ["--json", "200"], ["8200"]):  # PrivateData = none (the site's own service)
            err = one_line_error(seff(site, *args), 6)
            assert "belongs to another user" in err, err
        for private_data in ("accounts,jobs,usage", None):
            with service_where_slurm_says(site, "hide" if private_data else "unknown", private_data) as (cfg, log):
                assert seff(site, "100", cfg=cfg).returncode == 0  # one's own job as ever
                for others, missing in ((["200"], ["999"]), (["--json", "200"], ["--json", "999"]),
                                        (["8200"], ["8201"])):
                    other, none = seff(site, *others, cfg=cfg), seff(site, *missing, cfg=cfg)
                    said = (none.returncode, none.stdout, none.stderr.replace(missing[-1], others[-1]))
                    assert (other.returncode, other.stdout, other.stderr) == said, (private_data, others)
                    err = one_line_error(other, 3)
                    assert err == f"seff-gpu: job {others[-1]} is not in the GPU job database (it had no GPUs, has " \
                                  "not been ingested yet, or the id is wrong)\n", err
                with open(log) as fh:
                    text = fh.read()
                warned = text.count("Slurm's PrivateData is unknown")
                assert warned == (0 if private_data else 1), text[-2000:]
                if not private_data:
                    assert "answered as one that does not exist (exit 3), the safe side" in text
    finally:
        os.unlink(statedir.job(os.path.join(site["base"], "run"), 8200))


def test_no_gpus_names_the_reason(site):
    err = one_line_error(seff(site, "300"), 5)
    assert "had no GPUs allocated" in err and NO_GPU_REASON in err


def test_service_path_gives_the_direct_paths_bytes(site):
    out = os.path.join(site["base"], "root-cards")
    os.makedirs(out, exist_ok=True)
    for args in (["100"], ["--json", "201"], ["-u", USER, "-S", "2020-01-01", "-E", "2030-01-01"],
                 ["-A", "vision", "--json", "-S", "2020-01-01", "-E", "2030-01-01"], ["300"], ["100", "--html"]):
        runs = []
        for via in (None, "service"):
            a = [*args, f"{out}/{via}.html"] if args[-1] == "--html" else args
            p = seff(site, *a, as_user=None, via=via)
            html = pathlib.Path(f"{out}/{via}.html").read_text() if args[-1] == "--html" else None
            runs.append((p.returncode, p.stdout, p.stderr.replace(f"{out}/{via}.html", "FILE"), html))
        assert runs[0] == runs[1], args
        assert runs[0][0] in (0, 5)


def test_no_service_configured_is_one_line(site):
    err = one_line_error(seff(site, "100", cfg="none"), 1)
    assert "private to the service account" in err and "api_listen" in err


def test_munged_down_is_one_line(site):
    err = one_line_error(seff(site, "100", cfg="munged-down"), 1)
    assert "cannot reach the seff-gpu service at unix:" in err and "munged" in err


def test_munged_down_on_the_service_host_is_one_line(site):
    """The service cannot check credentials (its munged is gone): 503, which seff-gpu prints in one line."""
    base = site["base"]
    uds = f"{base}/run/api-nomunge.sock"
    common = f'[paths]\ndatabase = "{site["db"]}"\nstate_dir = "{base}/state"\nspool_dir = "{base}/spool"\n'
    with open(f"{base}/server-nomunge.toml", "w") as fh:
        fh.write(common + f'[service]\nmetrics_port = 0\napi_listen = "unix:{uds}"\nmunge_socket = "{base}/gone.sock"\n'
                 + "".join(f"{k} = 0\n" for k in ("ingest_interval_s", "enrich_interval_s", "rollup_interval_s",
                                                  "rollup_full_interval_s", "retention_interval_s",
                                                  "cards_interval_s")))
    with open(f"{base}/client-nomunge.toml", "w") as fh:
        fh.write(common + f'[service]\napi_url = "unix:{uds}"\nmunge_socket = "{site["munge_socket"]}"\n')
    os.chmod(f"{base}/client-nomunge.toml", 0o644)
    site["cfg"]["client-nomunge"] = f"{base}/client-nomunge.toml"
    log = f"{base}/serve-nomunge.log"
    with open(log, "w") as fh:
        p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config",
                              f"{base}/server-nomunge.toml", "serve"], env=site["env"], stdout=fh,
                             stderr=subprocess.STDOUT)
    try:
        wait_health(lambda: UnixConn(uds), p, log)
        err = one_line_error(seff(site, "100", cfg="client-nomunge"), 1)
        assert "HTTP 503" in err and "cannot check credentials" in err
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0


def sealed_post(site, body: bytes, *, for_uid: int = 0, sock: str | None = None,
                parts: bytes | None = None) -> tuple[int, str, str, str | None, bytes]:
    """A request sealed as seff-gpu seals one (for ``for_uid``, by this process's munged), sent raw: (status,
    its envelope, the plain text of a refusal, the answer's envelope, the answer's body)."""
    from slurm_gpueff.access import sealed

    out = sealed.seal(body, for_uid, sock or site["munge_socket"], 10)
    c = UnixConn(site["uds"])
    c.request("POST", "/v1/seff", out.parts if parts is None else parts,
              {"Authorization": f"MUNGE {out.envelope}", "Content-Type": sealed.CONTENT_TYPE})
    r = c.getresponse()
    data = r.read()
    seal = r.getheader("Gpueff-Seal")
    return r.status, out.envelope, "" if seal else data.decode(), seal, data


def test_credentials_are_checked(site):
    """Only a request sealed for the service's account, by a credential of this site's MUNGE key, made once,
    for exactly this body, is answered; the answer is sealed for the uid that asked and names the request."""
    from slurm_gpueff.access import sealed

    body = json.dumps({"jobid": "200", "json": True}).encode()
    assert post(site, body, None)[0] == 401
    assert post(site, body, "Bearer x")[0] == 401
    status, text = post(site, body, "MUNGE MUNGE:AAAAforged:")
    assert status == 401 and "credential refused" in text
    # sealed with another MUNGE key: a forgery as far as this site is concerned
    status, _, text, seal, _ = sealed_post(site, body, sock=site["other_munge_socket"])
    assert (status, seal) == (401, None) and "credential refused" in text
    # a plain credential of the site's key, as clients made before requests were sealed
    digest = hashlib.sha256(body).hexdigest()
    status, text = post(site, body, "MUNGE " + credential(digest, site["munge_socket"]))
    assert status == 401 and "not a sealed gpueff message" in text
    # sealed for another account than the service's (a client whose [service] user is wrong)
    status, _, text, seal, _ = sealed_post(site, body, for_uid=GPUSER_UID)
    assert (status, seal) == (401, None) and "sealed for another account" in text and 'user = "root"' in text
    # an envelope cannot carry another request's parts: a large request, its parts swapped for another's
    big = os.urandom(14000)  # incompressible: it needs parts beyond the envelope
    other = sealed.seal(big[::-1], 0, site["munge_socket"], 10)
    status, _, text, seal, data = sealed_post(site, big, parts=other.parts)
    assert seal is not None  # the envelope was good: the refusal is sealed for root
    env = sealed.open_envelope(seal, site["munge_socket"], 10)
    assert (status, env.head["status"]) == (401, 401)
    assert b"not the one the envelope was sealed with" in sealed.open_parts(env, data, 1 << 20, site["munge_socket"],
                                                                           10)
    # good once (root sees job 200): the answer sealed for root, naming this request; then replayed
    status, envelope, _, seal, data = sealed_post(site, body)
    assert status == 200 and seal is not None
    env = sealed.open_envelope(seal, site["munge_socket"], 10)
    assert env.uid == 0 and env.head["re"] == sealed.digest(envelope) and env.head["status"] == 200
    assert json.loads(sealed.open_parts(env, data, 1 << 20, site["munge_socket"], 10))["exit_code"] == 0
    c = UnixConn(site["uds"])
    c.request("POST", "/v1/seff", b"", {"Authorization": f"MUNGE {envelope}"})
    r = c.getresponse()
    assert r.status == 401 and "replayed" in r.read().decode() and r.getheader("Gpueff-Seal") is None


def test_bad_requests(site):
    """Bad queries from a known sender get a sealed one-line refusal (seff-gpu's client opens it)."""
    from slurm_gpueff.access.client import post_signed
    from slurm_gpueff.config import Config

    service = Config({"service": {"api_url": f"unix:{site['uds']}", "munge_socket": site["munge_socket"]}}).service
    for body in (b"not json", b"[1]", b'{"jobid": 5}', b'{"jobid": "1", "json": "yes"}', b'{"evil": 1}', b"{}",
                 b'{"user": "u", "limit": -1}', b'{"user": "u", "limit": "5"}', b'{"user": "u", "limit": true}',
                 b'{"user": "u", "limit": 1.5}', b'{"user": "u", "limit": 10000000000}'):
        reply = post_signed(service, "/v1/seff", body)
        assert reply.sealed and reply.status == 400 and reply.body.count(b"\n") == 1, (body, reply)
    big = b'{"jobid": "' + b"1" * 20000 + b'"}'
    reply = post_signed(service, "/v1/seff", big)
    assert reply.sealed and reply.status == 413, reply
    c = UnixConn(site["uds"])
    c.request("POST", "/v1/seff", b"x" * 40000)
    r = c.getresponse()  # beyond any sealed query: refused before anything is opened, plainly
    assert r.status == 413 and r.getheader("Gpueff-Seal") is None
    # 14 KB of [[[...]]] made the JSON parser raise RecursionError (500, a traceback in the log); text a
    # database cannot take (NUL, an unpaired surrogate) went on to SQLite's or PostgreSQL's driver
    logged = os.path.getsize(site["servers"]["unix"][2])
    for body, says in ((b"[" * 7000 + b"]" * 7000, "the body nests deeper than 2 levels"),
                       (b'{"jobid": ' + b"[" * 7000 + b'"100"' + b"]" * 7000 + b"}", "nests deeper"),
                       (b'{"user": "al\\u0000ice", "start": "2020-01-01", "end": "2030-01-01"}', "user holds a NUL"),
                       (b'{"jobid": "\\ud800"}', "jobid holds a NUL character or an unpaired surrogate")):
        reply = post_signed(service, "/v1/seff", body)
        assert reply.sealed and reply.status == 400 and reply.body.count(b"\n") == 1, (body[:40], reply)
        assert says in reply.reason(), (body[:40], reply)
    assert "Traceback" not in log_since(site, logged)
    c = UnixConn(site["uds"])
    c.request("GET", "/v1/other")
    assert c.getresponse().status == 404
    c = http.client.HTTPConnection("127.0.0.1", site["port"], timeout=10)
    c.request("GET", "/v1/health")
    assert c.getresponse().status == 200


def test_a_table_window_with_offsets_is_that_window_in_utc(site):
    """``start``/``end`` with an offset (``+14:00``, ``-12:00``) are turned into UTC: the same table as the
    window written in UTC, header included. Compared as they came, an aware time against the database's naive
    ones was a TypeError: a 500 with a traceback in the log. A time UTC cannot hold is seff-gpu's usage
    answer (exit 2), one line."""
    from slurm_gpueff.access.client import post_signed
    from slurm_gpueff.config import Config
    from slurm_gpueff.seff.query import Answer

    service = Config({"service": {"api_url": f"unix:{site['uds']}", "munge_socket": site["munge_socket"]}}).service
    logged = os.path.getsize(site["servers"]["unix"][2])

    def ask(start: str, end: str) -> Answer:
        reply = post_signed(service, "/v1/seff", json.dumps({"user": USER, "start": start, "end": end}).encode())
        assert reply.status == 200, reply
        return Answer.from_json(json.loads(reply.body))

    utc = ask("2020-01-01T00:00:00", "2030-01-01T00:00:00")
    assert utc.exit_code == 0 and ids(utc.stdout) == {100, 101, 300}, utc
    assert ask("2020-01-01T14:00:00+14:00", "2029-12-31T12:00:00-12:00") == utc
    assert ask("2020-01-01T00:00:00Z", "2030-01-01T00:00:00+00:00") == utc
    late = ask("2030-01-01T00:00:00+14:00", "2030-01-02T00:00:00")  # 2029-12-31 10:00 UTC: no job then
    assert late.exit_code == 0 and "2029-12-31 10:00" in late.stdout and ids(late.stdout) == set(), late
    for start in ("0001-01-01T00:00+14:00", "0001-01-01T13:59+14:00"):
        early = ask(start, "2030-01-01")
        assert early.exit_code == 2 and early.stdout == "", early
        assert early.stderr == "seff-gpu: a table's start or end time is out of range once turned into UTC\n"
    assert "Traceback" not in log_since(site, logged)


def test_job_ids_in_other_scripts_digits_are_refused_on_every_path(site):
    """``seff-gpu ７００３`` and ``٧٠٠٣`` were read as job 7003; here job 100 exists, and ``１００`` (full-width)
    and ``١٠٠`` (Arabic-Indic) are no id of it: one line, exit 2, the same through the service as gpuser and on
    root's direct path."""
    for text in ("\uff11\uff10\uff10", "\u0661\u0660\u0660"):
        runs = [seff(site, text), seff(site, text, as_user=None)]
        for p in runs:
            err = one_line_error(p, 2)
            assert err.startswith(f"seff-gpu: invalid job id {text!r}: ") and "digits 0-9 only" in err, err
        assert runs[0].stderr == runs[1].stderr


def test_serve_stops_cleanly_and_a_stale_socket_is_replaced(site):
    """Last: stops the Unix-socket service with SIGTERM (exit 0, socket removed); a new one takes over a
    stale socket file."""
    proc, conn, log = site["servers"]["unix"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert not os.path.exists(site["uds"])
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(site["uds"])
    stale.close()  # a socket file nobody listens on
    with open(log, "a") as fh:
        p = subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", site["cfg"]["unix"],
                              "serve"], env=site["env"], stdout=fh, stderr=subprocess.STDOUT)
    try:
        wait_health(conn, p, log)
        assert seff(site, "100").returncode == 0
        # a second service on the same live socket refuses to start, in one line
        q = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", site["cfg"]["unix"],
                            "serve"], env=site["env"], capture_output=True, text=True, timeout=60)
        assert q.returncode == 1 and "another process already listens there (uid 0 (root), pid " in q.stderr
        assert "Traceback" not in q.stderr
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(30) == 0


def test_a_damaged_database_is_one_line_503_for_every_request_but_the_health_check_says_so_too(tmp_path):
    """While the service's integrity check says the database is damaged (service/tasks.database_check), the
    API answers every request 503 with that line, after checking who asks: a node keeps its records for later
    and seff-gpu prints the line. Real munged, the API in this process on a Unix socket; the damage is the
    check's finding handed in, as `gpueff serve` does."""
    from slurm_gpueff.access.client import HEALTH_PATH, RECORDS_PATH, SEFF_PATH, post_signed, request
    from slurm_gpueff.config import Config
    from slurm_gpueff.service import api as api_mod

    munged, munge_sock = start_munged(str(tmp_path), "munge")
    found: list[str | None] = ["the job database is damaged (database disk image is malformed)"]
    cfg = Config({"paths": {"database": f"{tmp_path}/db/gpueff.db", "spool_dir": f"{tmp_path}/spool",
                            "state_dir": f"{tmp_path}/state"},
                  "service": {"api_listen": f"unix:{tmp_path}/api.sock", "munge_socket": munge_sock}})
    server = api_mod.start(cfg, None, lambda: found[0])
    try:
        def health() -> tuple[int, dict]:
            reply = request(f"unix:{tmp_path}/api.sock", "GET", HEALTH_PATH, timeout=10)
            return reply.status, json.loads(reply.body)

        assert health() == (503, {"status": "damaged", "detail": found[0]})
        for path, body in ((SEFF_PATH, b'{"jobid": "1"}'), (RECORDS_PATH, b'{"node": "n1", "records": []}')):
            reply = post_signed(cfg.service, path, body)
            assert reply.status == 503, (path, reply)
            assert reply.reason() == f"{found[0]}: the service reads and takes nothing until it is restored from a " \
                                     "backup", reply.reason()
        found[0] = None  # the next check finds the file sound (restored)
        assert health() == (200, {"status": "ok"})
    finally:
        api_mod.stop(server)
        munged.terminate()
        munged.wait(10)


def test_a_push_beyond_the_slots_is_told_busy_and_keeps_its_records(tmp_path, monkeypatch):
    """After an outage every node pushes at once; the service stores [service] push_slots pushes at a time and
    tells the rest "busy" (503) within push_wait_s, rather than taking them all and answering each after the
    node stopped waiting. A node told busy keeps its records and stores them at its next pass. Real munged, real
    forwarder process; the API in this process on a Unix socket, its slots held by the test as a herd of pushes
    would."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.service import api as api_mod
    from slurm_gpueff.storage.db import make_engine

    munged, munge_sock = start_munged(str(tmp_path), "munge")
    db = f"{tmp_path}/db/gpueff.db"
    os.makedirs(os.path.dirname(db))
    engine = make_engine(db)
    svc = {"api_listen": f"unix:{tmp_path}/api.sock", "munge_socket": munge_sock, "push_wait_s": 0.3}
    cfg = Config({"paths": {"database": db, "spool_dir": f"{tmp_path}/spool", "state_dir": f"{tmp_path}/state"},
                  "service": svc})
    node_cfg = tmp_path / "node.toml"
    node_cfg.write_text(f'[site]\ncluster = "c"\n[paths]\nspool_dir = "{tmp_path}/node"\nstate_dir = "{tmp_path}/ns"\n'
                        f'[service]\napi_url = "unix:{tmp_path}/api.sock"\nmunge_socket = "{munge_sock}"\n')
    for i in range(3):
        spool.write_record(f"{tmp_path}/node", sim_record(7000 + i))
    server = api_mod.start(cfg, engine)
    assert server.api.push_wait_s == 0.3
    forward = [sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", str(node_cfg), "forward", "--once"]
    try:
        for _ in range(cfg.service.push_slots):
            assert server.api.push_slots.acquire(timeout=1)
        busy = subprocess.run(forward, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert busy.returncode == 1 and "HTTP 503" in busy.stderr and "busy" in busy.stderr, busy.stderr
        assert len(os.listdir(f"{tmp_path}/node/incoming")) == 3
        # "Busy" says when to come back (its turn), and the forwarder keeps it for its next wait (not its
        # failure backoff); summarizing, told to make way, waits while a push waits for a slot.
        from slurm_gpueff.config import load
        from slurm_gpueff.node.push import Forwarder

        server.api.pace_s = server.api.alone_s = 7.0
        res = Forwarder(load(str(node_cfg))).run_pass()
        assert (res.ok, res.left, res.retry_after_s) == (False, 3, 7), res  # one pace from now: nobody else waits
        pushed: list[int] = []
        server.api.pace_s, server.api.alone_s, server.api.turns_until = 0.5, 0.5, 0.0  # forget the turns given above
        server.api.push_wait_s = 5.0  # long enough to be seen waiting on a loaded machine
        waiting = threading.Thread(target=lambda: pushed.append(Forwarder(load(str(node_cfg))).run_pass().left))
        waiting.start()
        deadline = time.monotonic() + 30
        while not server.api.waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert server.api.waiting == 1
        server.api.make_way(30)
        # it returned once the push stopped waiting (told busy after 5 s) and its turn, given then, had come
        assert server.api.waiting == 0 and server.api.turns_until > 0 and time.monotonic() >= server.api.turns_until
        waiting.join(30)
        assert pushed == [3]
        for _ in range(cfg.service.push_slots):
            server.api.push_slots.release()
        done = subprocess.run(forward, capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert done.returncode == 0, done.stderr
        assert os.listdir(f"{tmp_path}/node/incoming") == []
        with engine.connect() as c:
            from sqlalchemy import text

            assert sorted(r[0] for r in c.execute(text("SELECT job_id FROM job"))) == [7000, 7001, 7002]
    finally:
        api_mod.stop(server)
        engine.dispose()
        munged.terminate()
        munged.wait(10)


def _one_reply(raw: list[bytes], close: bool = True) -> tuple[str, list[bytes]]:
    """A loopback TCP server that reads one request and writes ``raw`` piece by piece; its URL and what it read."""
    import contextlib

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    got: list[bytes] = []

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                data += conn.recv(65536)
            head, _, body = data.partition(b"\r\n\r\n")
            length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n")
                              if ln.lower().startswith(b"content-length")))
            while len(body) < length:
                body += conn.recv(65536)
            got.append(data)
            for piece in raw:
                conn.sendall(piece)
                time.sleep(0.02)
            if not close:  # open until the client closes: a client that read to the close would time out
                conn.settimeout(30)
                with contextlib.suppress(OSError):
                    conn.recv(1)
        srv.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", got


def test_the_client_reads_replies_in_pieces_with_or_without_a_length():
    """access/client.request (ours, not http.client, for seff-gpu's start): a reply split anywhere, a body
    read to its Content-Length, a body read to the close; the request itself is plain HTTP/1.1. Real sockets."""
    from slurm_gpueff.access.client import request

    url, got = _one_reply([b"HTTP/1.1 200 OK\r\nContent-Le", b"ngth: 11\r\nX: y\r\n\r\nhello", b" world"], close=False)
    reply = request(url, "POST", "/v1/seff", b'{"a": 1}', {"Authorization": "MUNGE x"}, timeout=3)
    assert (reply.status, reply.body) == (200, b"hello world")  # read to the length, not to the close
    assert got[0].startswith(b"POST /v1/seff HTTP/1.1\r\n") and b"\r\nAuthorization: MUNGE x\r\n" in got[0]
    assert got[0].endswith(b'\r\n\r\n{"a": 1}') and b"\r\nContent-Length: 8\r\n" in got[0]
    assert f"\r\nHost: {url.split('//')[1]}\r\n".encode() in got[0]
    url, got = _one_reply([b"HTTP/1.0 503 Service Unavailable\r\n\r\nbusy: other", b" nodes\n"])
    reply = request(url.replace("//", "//who:secret@") + "/ignored", "GET", "/v1/health", timeout=10)
    assert (reply.status, reply.reason()) == (503, "busy: other nodes")
    assert f"\r\nHost: {url.split('//')[1]}\r\n".encode() in got[0] and b"secret" not in got[0]


def test_a_bad_reply_is_one_line_unreachable(tmp_path):
    """Whatever answers on the service's address, seff-gpu and the forwarder get Unreachable with one line.
    Real munged signs each request; real sockets."""
    from slurm_gpueff.access.client import Unreachable, post_signed
    from slurm_gpueff.config import Config

    munged, munge_sock = start_munged(str(tmp_path), "munge")
    try:
        for raw, why in (([b"SSH-2.0-OpenSSH_9.2\r\n\r\n"], "not an HTTP reply: 'SSH-2.0-OpenSSH_9.2'"),
                         ([b"HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\nshort"], "cut short (5 of 50 bytes)"),
                         ([], "the connection closed before a reply"),
                         ([b"HTTP/1.1 200 OK\r\nContent-Le"], "the reply was cut short")):
            url, _ = _one_reply(raw)
            service = Config({"service": {"api_url": url, "munge_socket": munge_sock, "api_timeout_s": 5}}).service
            with pytest.raises(Unreachable) as exc:
                post_signed(service, "/v1/seff", b"{}", name="the seff-gpu service")
            line = str(exc.value)
            assert line.startswith(f"cannot reach the seff-gpu service at {url}: ") and why in line, line
            assert "\n" not in line, line
    finally:
        munged.terminate()
        munged.wait(10)


def test_nodes_told_busy_are_given_turns_at_the_pace_pushes_are_stored(monkeypatch):
    """Each node told "busy" gets its own turn: after the pushes waiting now and the turns given before it, one
    push apart: the shorter of the pace (the measured gap between two pushes stored while others waited, not
    counting a gap in which nobody waited) and a push's time when nobody waited. So a herd comes back spread
    out at the pace the service stores once it has passed, neither all again one interval later nor so spread
    that the service idles. The clock is the test's."""
    import types

    from slurm_gpueff.config import Config
    from slurm_gpueff.service import api as api_mod

    clock = [1000.0]
    monkeypatch.setattr(api_mod, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    api = api_mod.Api(Config({"service": {"forward_interval_s": 15}}))
    assert api.pace_s == api.alone_s == api_mod.PACE_START_S and api.push_wait_s == Config().service.push_wait_s

    def push(after_s: float, held_s: float, others_waiting: int) -> None:
        clock[0] += after_s
        api.waiting = others_waiting
        with api.push_slot():
            clock[0] += held_s
        api.waiting = 0

    push(0.0, 0.02, 0)  # nobody waits: a push's time alone
    assert (api.pace_s, api.alone_s) == (0.05, pytest.approx(0.05 + 0.1 * (0.02 - 0.05)))
    push(9.0, 0.02, 1)  # nobody waited since the last one: its 9 s are idle time, not the pace
    assert api.pace_s == api_mod.PACE_START_S
    push(1.05, 0.02, 1)  # others waited since the last one: 1.07 s is the service's pace
    assert api.pace_s == pytest.approx(0.05 + 0.1 * (1.07 - 0.05))
    push(5.0, 0.02, 0)
    assert api.pace_s == pytest.approx(0.152 + 0.1 * (5.02 - 0.152))
    push(30.0, 0.02, 0)  # the last one left nobody waiting: this gap is not counted, the push's time is
    assert api.pace_s == pytest.approx(0.6388) and api.alone_s == pytest.approx(0.047 + 0.1 * (0.02 - 0.047))

    api.pace_s, api.alone_s = 2.5, 9.0
    api.waiting = 4  # four pushes wait now: 10 s of the service's work before the first turn
    turns = [api.turn() for _ in range(4)]
    assert turns == [13, 15, 18, 20], turns
    clock[0] += 100.0  # the turns given long ago have passed: the next one starts from now
    api.waiting = 0
    assert api.turn() == 3
    api.alone_s = 0.5  # once the herd has passed a push takes 0.5 s: the turns are that far apart
    assert [api.turn() for _ in range(4)] == [3, 4, 4, 5]
    assert api_mod.Api(Config({"service": {"api_timeout_s": 3}})).push_wait_s == 1.5  # half the nodes' wait


@pytest.mark.parametrize("slots", [1, 3])
def test_the_push_slots_and_their_wait_are_the_configured_ones(slots):
    """[service] push_slots pushes are stored at once: with that many held, one more waits push_wait_s for a
    slot, is told "busy" (503, with its turn), and takes a slot as soon as one is given back. push_wait_s is
    at most half of api_timeout_s (the nodes' wait). Real threads, real clock."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.service import api as api_mod

    api = api_mod.Api(Config({"service": {"push_slots": slots, "push_wait_s": 0.3}}))
    assert api.push_wait_s == 0.3
    with contextlib.ExitStack() as held:
        for _ in range(slots):  # these are taken at once: none waits
            t0 = time.monotonic()
            held.enter_context(api.push_slot())
            assert time.monotonic() - t0 < 0.25
        t0 = time.monotonic()
        with pytest.raises(api_mod.HttpError) as busy, api.push_slot():
            pass
        waited = time.monotonic() - t0
        assert busy.value.status == 503 and "busy" in str(busy.value) and (busy.value.retry_after_s or 0) >= 1
        assert 0.3 <= waited < 5, waited
        assert api.waiting == 0
        got: list[float] = []

        def push() -> None:  # waits for a slot: the first one given back
            t0 = time.monotonic()
            with api.push_slot():
                got.append(time.monotonic() - t0)

        api.push_wait_s = 30.0
        waiter = threading.Thread(target=push)
        waiter.start()
        deadline = time.monotonic() + 10
        while not api.waiting and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.waiting == 1 and not got
        held.close()  # the slots are given back: the waiting push takes one
        waiter.join(10)
        assert len(got) == 1 and got[0] < 10
    capped = api_mod.Api(Config({"service": {"push_slots": slots, "push_wait_s": 8, "api_timeout_s": 10}}))
    assert capped.push_wait_s == 5.0


def test_background_work_makes_way_while_a_users_question_is_answered(tmp_path):
    """The card pass and summarizing call the API's make_way before each card or batch: it also waits while
    a user's question is being answered, so that a user at a terminal does not share the interpreter with
    them. Real munged, a real sealed request from the client code; the API in this process on a Unix socket,
    its seff answer made slow by the test (0.8 s) to be seen in flight."""
    from slurm_gpueff.access.client import SEFF_PATH, post_signed
    from slurm_gpueff.config import Config
    from slurm_gpueff.service import api as api_mod
    from slurm_gpueff.storage.db import make_engine

    munged, munge_sock = start_munged(str(tmp_path), "munge")
    db = f"{tmp_path}/db/gpueff.db"
    os.makedirs(os.path.dirname(db))
    engine = make_engine(db)
    cfg = Config({"paths": {"database": db, "spool_dir": f"{tmp_path}/spool", "state_dir": f"{tmp_path}/state"},
                  "service": {"api_listen": f"unix:{tmp_path}/api.sock", "api_url": f"unix:{tmp_path}/api.sock",
                              "munge_socket": munge_sock}})
    server = api_mod.start(cfg, engine)
    seen: list[int] = []

    def slow_answer(uid: int, payload: object) -> api_mod.Handled:
        seen.append(server.api.answering)
        time.sleep(0.8)
        return api_mod.Handled(200, b"{}", f"uid {uid} slow")

    server.api.seff = slow_answer  # type: ignore[method-assign]
    try:
        asking = threading.Thread(target=lambda: post_signed(cfg.service, SEFF_PATH, b"{}"))
        asking.start()
        deadline = time.monotonic() + 30
        while not server.api.answering and time.monotonic() < deadline:
            time.sleep(0.01)
        t0 = time.monotonic()
        server.api.make_way(30)
        waited = time.monotonic() - t0
        asking.join(30)
        assert seen == [1] and server.api.answering == 0
        assert 0.3 < waited < 10, waited  # it returned once the answer was made, not at its 30-s bound
    finally:
        api_mod.stop(server)
        engine.dispose()
        munged.terminate()
        munged.wait(10)
