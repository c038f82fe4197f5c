"""``gpueff doctor --role service|node|login``: what each host of a site needs. The API is the service's own
(service/api.py) on loopback; the folders are real folders with real modes."""

from __future__ import annotations

import json
import shutil
import socket
import tempfile
from pathlib import Path

import pytest
from dbfiles import gpueff

from slurm_gpueff.cli import doctor
from slurm_gpueff.config import Config
from slurm_gpueff.service import api


def lines(check, cfg: Config) -> list[tuple[str, str, str]]:  # noqa: ANN001
    rep = doctor.Report()
    check(rep, cfg)
    return [(ln["status"], ln["check"], ln["detail"]) for ln in rep.lines]


def test_a_folder_closed_to_other_users_is_named():
    base = Path(tempfile.mkdtemp(prefix="gpueff-doctor-", dir="/tmp"))  # pytest's own tmp is 0700
    try:
        closed_folder_is_named(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def closed_folder_is_named(tmp_path: Path) -> None:
    shut = tmp_path / "root-only"
    (shut / "bin").mkdir(parents=True)
    exe = shut / "bin" / "python3"
    exe.write_text("")
    exe.chmod(0o755)
    tmp_path.chmod(0o755)
    shut.chmod(0o700)  # pyenv under /root: root installs fine, no user gets in
    assert doctor._closed_to_others(str(exe), 0o005) == str(shut)
    shut.chmod(0o755)
    assert doctor._closed_to_others(str(exe), 0o005) is None
    exe.chmod(0o700)
    assert doctor._closed_to_others(str(exe), 0o005) == str(exe)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_login_role_makes_a_sealed_round_trip_with_the_service_or_says_why(tmp_path):
    """doctor's API check is a sealed round trip (/v1/ping), not /v1/health: it FAILs with the service's munged
    down (health still answers), PASSes with a real one. Real munged; the service's API in this process."""
    from daemons import start_munged

    assert [s for s, _, _ in lines(doctor.check_api, Config())] == [doctor.FAIL]
    munged, sock = start_munged(str(tmp_path), "munge")
    try:
        port = free_port()
        client = Config({"service": {"api_url": f"http://127.0.0.1:{port}", "api_timeout_s": 2,
                                     "munge_socket": sock}})
        (status, _, detail), = lines(doctor.check_api, client)
        assert status == doctor.FAIL and "Connection refused" in detail and "gpueff serve" in detail, detail
        for service_sock, want in ((str(tmp_path / "gone.sock"), doctor.FAIL), (sock, doctor.PASS)):
            cfg = Config({"paths": {"database": str(tmp_path / "g.db")},
                          "service": {"api_listen": f"127.0.0.1:{port}", "munge_socket": service_sock}})
            server = api.start(cfg)
            try:
                (status, _, detail), = lines(doctor.check_api, client)
            finally:
                api.stop(server)
            assert status == want, detail
        assert f"http://127.0.0.1:{port}: a sealed round trip with the service" in detail and "uid 0" in detail
    finally:
        munged.terminate()
        munged.wait(10)


def test_munge_check_says_why_without_munged(tmp_path):
    cfg = Config({"service": {"munge_socket": str(tmp_path / "no-munged.socket")}})
    (status, check, detail), = lines(doctor.check_munge, cfg)
    assert (status, check) == (doctor.FAIL, "munge") and detail.startswith("no credential from munged")


@pytest.mark.process
def test_each_role_runs_its_own_checks(tmp_path):
    cfg = tmp_path / "g.toml"
    cfg.write_text(f'[paths]\ndatabase = "{tmp_path}/g.db"\nspool_dir = "{tmp_path}/spool"\n'
                   f'state_dir = "{tmp_path}/state"\n[service]\napi_url = "http://127.0.0.1:{free_port()}"\n'
                   f'munge_socket = "{tmp_path}/none.socket"\n')
    checks = {}
    for role in ("login", "node", "service"):
        p = gpueff("--config", str(cfg), "doctor", "--role", role, "--json")
        assert p.returncode in (0, 1), p.stderr
        checks[role] = {c["check"].split()[0] for c in json.loads(p.stdout)["checks"]}
    assert {"install", "munge", "api"} <= checks["login"] and not {"database", "nvml", "spool"} & checks["login"]
    assert {"install", "nvml", "agent", "spool"} <= checks["node"] and "database" not in checks["node"]
    assert {"database", "spool"} <= checks["service"] and "nvml" not in checks["service"]
    p = gpueff("--config", str(cfg), "doctor", "--role", "bogus")
    assert p.returncode == 2 and "invalid choice" in p.stderr
