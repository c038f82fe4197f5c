"""Nothing silent on the node: a full spool filesystem, then a reboot, loses no record; `gpueff forward` sends
what waits in a fallback spool (or moves it back once the spool takes records again); `gpueff doctor --role
node` FAILs while records wait there, on a full spool filesystem, and while the forwarder does not run.

Everything is real: the hook scripts as slurmd runs them, a spool on a small loop-mounted ext4 filesystem
(a size-limited tmpfs where loop devices are not lent) filled up, the state dir on a tmpfs that the "reboot"
replaces with an empty one (as /run is at boot), a private munged, `gpueff serve` with its API on a loopback
port, `gpueff forward` and `gpueff doctor` processes. The GPUs are the simulated backend's (no GPU here).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
from daemons import PushSite, gpueff, start_munged
from hooksite import HookSite

from slurm_gpueff import spool
from slurm_gpueff.cli import doctor
from slurm_gpueff.config import Config

pytestmark = [pytest.mark.process, pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("munged") or not shutil.which("mount"),
    reason="needs root (mounts), MUNGE")]


def mount(what: list[str], where: str) -> None:
    os.makedirs(where, exist_ok=True)
    subprocess.run(["mount", *what, "gpueff-test", where], check=True, capture_output=True)


def umount(where: str) -> None:
    subprocess.run(["umount", "-l", where], capture_output=True)


def small_filesystem(base: str, where: str) -> str:
    """A small filesystem at ``where``: ext4 on a loop device if one is lent, else a 4 MiB tmpfs; its kind."""
    image = os.path.join(base, "spool.img")
    with open(image, "wb") as fh:
        fh.truncate(8 * 1024 * 1024)
    made = subprocess.run(["mkfs.ext4", "-q", "-F", image], capture_output=True)
    os.makedirs(where, exist_ok=True)
    if made.returncode == 0 and subprocess.run(["mount", "-o", "loop", image, where],
                                               capture_output=True).returncode == 0:
        return "ext4"
    mount(["-t", "tmpfs", "-o", "size=4m,mode=700"], where)
    return "tmpfs"


def fill(spool_dir: str) -> str:
    """Fill the spool's filesystem to the last byte (as root: the reserved blocks too); the filler's path."""
    spool.ensure_dirs(spool_dir)
    filler = os.path.join(spool_dir, "filler")
    with open(filler, "ab", buffering=0) as fh:  # unbuffered: every write meets the full disk itself
        for size in (1 << 20, 1 << 16, 1 << 12, 1 << 8, 1):
            try:
                while True:
                    fh.write(b"\0" * size)
                    os.fsync(fh.fileno())
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    with pytest.raises(OSError) as full:  # a record cannot be written there now
        spool.atomic_write(os.path.join(spool_dir, spool.INCOMING, "probe"), b"{}" * 1024)
    assert full.value.errno == errno.ENOSPC
    return filler


def checks(config: str) -> dict[str, dict[str, str]]:
    p = gpueff(config, "doctor", "--role", "node", "--json")
    out, _ = p.communicate(timeout=120)
    assert p.returncode in (0, 1), out
    return {c["check"]: c for c in json.loads(out[out.index("{"):])["checks"]}


def jobs(db: str) -> list[int]:
    con = sqlite3.connect(db)
    try:
        return sorted(r[0] for r in con.execute("SELECT job_id FROM job"))
    finally:
        con.close()


def gpu_rows(db: str) -> int:
    con = sqlite3.connect(db)
    try:
        return int(con.execute("SELECT count(*) FROM job_gpu").fetchone()[0])
    finally:
        con.close()


def files(d: str) -> list[str]:
    out = []
    for root, _dirs, names in os.walk(d):
        out += [os.path.join(root, n) for n in names]
    return sorted(out)


@pytest.fixture
def push_site() -> Iterator[tuple[str, PushSite]]:
    """(base dir, a running service): munged and `gpueff serve` with SQLite, under a temp dir."""
    base = tempfile.mkdtemp(prefix="gpueff-fallback-", dir="/tmp")
    os.chmod(base, 0o755)
    munged, sock = start_munged(base, "munge")
    site = PushSite(base, f"sqlite:///{base}/service/gpueff.db", sock)
    try:
        site.start()
        yield base, site
    finally:
        site.kill(signal.SIGTERM)
        munged.kill()
        shutil.rmtree(base, ignore_errors=True)


def node_config(site: PushSite, hooks: HookSite, spool_dir: str, state: str, fallback: str) -> None:
    hooks.write_config(text=f'''[site]
cluster = "push"
[paths]
spool_dir = "{spool_dir}"
state_dir = "{state}"
spool_fallback_dir = "{fallback}"
[spool]
max_file_mb = 1
[collector]
backend = "simulated"
[service]
munge_socket = "{site.sock}"
api_url = "http://127.0.0.1:{site.port}"
forward_interval_s = 0.2
forward_max_backoff_s = 1
''')


def run_job(hooks: HookSite, job: int) -> str:
    """Prolog and Epilog of ``job``; the Epilog's stderr."""
    p, _ = hooks.run("prolog", job)
    assert p.returncode == 0, p.stderr
    p, _ = hooks.run("epilog", job)
    assert p.returncode == 0, p.stderr
    return p.stderr


def test_spool_full_then_reboot_loses_nothing_and_doctor_says_so(push_site):
    base, site = push_site
    db = os.path.join(base, "service", "gpueff.db")
    node = os.path.join(base, "node01")
    spool_dir, state, fallback = (os.path.join(node, d) for d in ("spool", "run", "fallback"))
    hooks = HookSite(node)
    node_config(site, hooks, spool_dir, state, fallback)
    try:
        kind = small_filesystem(base, spool_dir)
        mount(["-t", "tmpfs", "-o", "size=4m,mode=755"], state)
        filler = fill(spool_dir)
        # five jobs end while the spool's filesystem is full: each record goes to the persistent fallback
        for job in range(9001, 9006):
            said = run_job(hooks, job)
            assert f"wrote {fallback}/incoming/job-{job}-node01.json instead (persistent storage)" in said, said
        assert len(files(os.path.join(fallback, "incoming"))) == 5
        c = checks(hooks.config_path)
        assert c["spool space"]["status"] == doctor.FAIL and "full" in c["spool space"]["detail"], c["spool space"]
        assert c["spool fallback"]["status"] == doctor.FAIL, c["spool fallback"]
        assert f"5 record(s) in {fallback}/incoming (persistent)" in c["spool fallback"]["detail"]
        assert c["forwarder"]["status"] == doctor.FAIL and "has not run" in c["forwarder"]["detail"]

        # the node reboots before any job ends or any forwarder runs: /run comes back empty
        umount(state)
        mount(["-t", "tmpfs", "-o", "size=4m,mode=755"], state)
        assert os.listdir(state) == []
        # the forwarder starts at boot: it sends the stranded records (the spool is still full)
        p = gpueff(hooks.config_path, "forward", "--once")
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
        assert jobs(db) == list(range(9001, 9006)) and gpu_rows(db) == 10  # all five, once each
        assert files(os.path.join(fallback, "incoming")) == []
        c = checks(hooks.config_path)
        assert c["spool fallback"]["status"] == doctor.PASS, c["spool fallback"]
        assert c["forwarder"]["status"] == doctor.PASS, c["forwarder"]
        assert c["spool space"]["status"] == doctor.FAIL  # still full

        # two more jobs end on the full spool; the admin frees it; the forwarder moves them back, then sends
        for job in (9006, 9007):
            run_job(hooks, job)
        os.unlink(filler)
        p = gpueff(hooks.config_path, "forward", "--once", "-v")
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0 and "moved 2 record(s) from fallback spools back" in out, out
        assert jobs(db) == list(range(9001, 9008)) and gpu_rows(db) == 14
        assert files(fallback) == []
        assert files(os.path.join(spool_dir, spool.INCOMING)) == []
        assert files(os.path.join(spool_dir, spool.QUARANTINE)) == []
        c = checks(hooks.config_path)
        assert c["spool fallback"]["status"] == doctor.PASS, c["spool fallback"]
        # free again; a spool on tmpfs (no loop device here) is itself a warning: a reboot empties it
        assert c["spool space"]["status"] == (doctor.PASS if kind == "ext4" else doctor.WARN), c["spool space"]
    finally:
        umount(state)
        umount(spool_dir)


def test_doctor_fails_while_the_forwarder_is_stopped_or_killed(push_site):
    base, site = push_site
    config, _spool = site.node("node02")
    beat = os.path.join(base, "node02", "run", "forward.json")

    def start() -> subprocess.Popen:
        p = gpueff(config, "forward")
        for _ in range(600):
            try:
                with open(beat) as fh:
                    if json.load(fh)["pid"] == p.pid:
                        return p
            except (OSError, ValueError, KeyError):
                pass
            assert p.poll() is None, p.communicate()[0]
            time.sleep(0.05)
        raise AssertionError("no heartbeat from gpueff forward")

    assert checks(config)["forwarder"]["status"] == doctor.FAIL  # never ran
    # right after `systemctl enable --now gpueff-forward`: doctor gives a forwarder of this config its start
    p = gpueff(config, "forward")
    c = checks(config)["forwarder"]
    assert c["status"] == doctor.PASS and f"runs (pid {p.pid})" in c["detail"], c
    p.send_signal(signal.SIGTERM)
    p.wait(30)
    c = checks(config)["forwarder"]
    assert c["status"] == doctor.FAIL and "stopped" in c["detail"] and "last ran" in c["detail"], c
    p = start()
    p.send_signal(signal.SIGSTOP)  # hung: alive, but no pass any more; as if its next pass was due an hour ago
    try:
        with open(beat) as fh:
            data = json.load(fh)
        data.update(time=data["time"] - 3600, next_due=data["time"] - 3600)
        with open(beat, "w") as fh:
            json.dump(data, fh)
        c = checks(config)["forwarder"]
        assert c["status"] == doctor.FAIL and "overdue" in c["detail"] and "last ran 01:00:" in c["detail"], c
    finally:
        p.kill()
        p.wait(30)
    c = checks(config)["forwarder"]
    assert c["status"] == doctor.FAIL and f"(pid {p.pid}) is not running" in c["detail"], c


def test_without_api_url_there_is_no_forwarder_to_check(tmp_path):
    cfg = Config({"paths": {"spool_dir": str(tmp_path / "spool"), "state_dir": str(tmp_path / "state")}})
    rep = doctor.Report()
    doctor.check_forwarder(rep, cfg)
    (line,) = rep.lines
    assert line["status"] == doctor.PASS and "no [service] api_url" in line["detail"], line


def test_records_in_a_tmpfs_fallback_are_said_to_be_lost_on_reboot(tmp_path):
    """A state dir on tmpfs (as /run): doctor FAILs while records wait in its fallback, saying a reboot loses
    them; a fallback of someone else (not private) is not ours and not counted."""
    state = str(tmp_path / "run")
    mount(["-t", "tmpfs", "-o", "size=1m,mode=755"], state)
    try:
        cfg = Config({"paths": {"spool_dir": str(tmp_path / "spool"), "state_dir": state}})
        fb = os.path.join(state, "spool-fallback")
        assert spool.private_dir(fb, create=True)
        from hooksite import make_record

        for job in (1, 2):
            spool.write_record(fb, make_record(job))
        rep = doctor.Report()
        doctor.check_spool_fallback(rep, cfg)
        (line,) = rep.lines
        assert line["status"] == doctor.FAIL, line
        assert f"2 record(s) in {fb}/incoming (not persistent: lost on reboot)" in line["detail"], line
        assert "nothing sends them from there (no [service] api_url)" in line["detail"]
    finally:
        umount(state)


def test_forward_sends_from_a_fallback_but_never_an_older_copy_or_a_planted_file(push_site):
    """The spool is read-only (a remount), so nothing moves back: the forwarder sends the fallback's records
    itself. A fallback copy of a record that is also in the spool is the older one: kept in the fallback's
    quarantine, not sent (the spool's is); a symbolic link planted there is quarantined, never followed."""
    from hooksite import make_record

    base, site = push_site
    db = os.path.join(base, "service", "gpueff.db")
    node = os.path.join(base, "node03")
    spool_dir, state, fallback = (os.path.join(node, d) for d in ("spool", "run", "fallback"))
    hooks = HookSite(node)
    node_config(site, hooks, spool_dir, state, fallback)
    spool.write_record(spool_dir, make_record(5, cluster="push", user="new"))
    assert spool.private_dir(fallback, create=True)
    spool.write_record(fallback, make_record(5, cluster="push", user="old"))
    spool.write_record(fallback, make_record(6, cluster="push"))
    secret = os.path.join(base, "secret.json")
    with open(secret, "w") as fh:
        json.dump(make_record(7, cluster="push"), fh)
    os.symlink(secret, os.path.join(fallback, spool.INCOMING, "job-7-node01.json"))
    subprocess.run(["mount", "--bind", spool_dir, spool_dir], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", spool_dir], check=True)
        p = gpueff(hooks.config_path, "forward", "--once", "-v")
        out, _ = p.communicate(timeout=120)
        assert jobs(db) == [5, 6], out
        con = sqlite3.connect(db)
        try:
            assert con.execute("SELECT user FROM job WHERE job_id = 5").fetchone()[0] == "new"
        finally:
            con.close()
        q = os.path.join(fallback, spool.QUARANTINE)
        assert sorted(os.listdir(q)) == ["job-5-node01.json", "job-5-node01.json.error", "job-7-node01.json",
                                         "job-7-node01.json.error"], os.listdir(q)
        assert os.path.islink(os.path.join(q, "job-7-node01.json"))  # moved as it is, never followed
        assert files(os.path.join(fallback, spool.INCOMING)) == []
        c = checks(hooks.config_path)["spool fallback"]
        assert c["status"] == doctor.FAIL and f"2 in {fallback}/quarantine" in c["detail"], c
    finally:
        umount(spool_dir)
