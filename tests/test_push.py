"""Nodes push their records to ``gpueff serve`` (``gpueff forward``), with everything real: a private
``munged``, ``gpueff serve`` processes with the API on a TCP port, ``gpueff forward`` processes on node
spools, SQLite, and a private PostgreSQL cluster that the fault test stops and starts. Nothing is lost or
doubled when the service is killed (``kill -9``) mid-push, the database is down, or a forwarder is killed
mid-send; a push without a good root credential, or too large, writes nothing.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import sqlite3
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest
import synthetic
from daemons import PushSite, gpueff, start_munged
from hooksite import make_record
from pgutil import PrivateCluster
from sqlalchemy import text
from test_spool_trust import GOOD, check_quarantine, plant

from slurm_gpueff import spool
from slurm_gpueff.storage.db import make_engine

USER = "gpuser"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = [pytest.mark.process, pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("munged")
    or subprocess.run(["id", USER], capture_output=True).returncode != 0,
    reason="needs root, MUNGE and the user gpuser")]
@pytest.fixture
def munge() -> Iterator[tuple[str, str, str]]:
    """(base dir, munged socket, another munged's socket: another key)."""
    base = tempfile.mkdtemp(prefix="gpueff-push-", dir="/tmp")
    os.chmod(base, 0o755)  # gpuser reaches the munge socket under it
    procs = []
    try:
        p, sock = start_munged(base, "munge")
        q, other = start_munged(base, "munge-other")
        procs += [p, q]
        yield base, sock, other
    finally:
        for p in procs:
            p.kill()
        shutil.rmtree(base, ignore_errors=True)


def pending(spool_dir: str) -> int:
    d = os.path.join(spool_dir, spool.INCOMING)
    return sum(1 for n in os.listdir(d) if n.endswith(".json")) if os.path.isdir(d) else 0


def run(config: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    p = gpueff(config, *args)
    out, _ = p.communicate(timeout=timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, "")


def sqlite_jobs(db: str) -> list[int]:
    con = sqlite3.connect(db)
    try:
        return sorted(r[0] for r in con.execute("SELECT job_id FROM job"))
    finally:
        con.close()


def test_push_stores_acknowledges_and_quarantines_on_both_sides(munge):
    base, sock, _other = munge
    db = os.path.join(base, "service", "gpueff.db")
    site = PushSite(base, f"sqlite:///{db}", sock)
    site.start()
    try:
        node, node_spool = site.node("node01")
        with open(node, "a") as fh:
            fh.write("[spool]\nmax_file_mb = 1\n")
        bad = plant(node_spool, _Tmp(base))
        invalid = synthetic.record(999, cluster="push", gpus=1)
        invalid["schema"] = 999
        spool.write_record(node_spool, invalid)
        p = run(node, "forward", "--once")
        assert p.returncode == 0, p.stdout
        check_quarantine(node_spool, bad)  # what the node did not write stays on the node, quarantined
        assert sqlite_jobs(db) == list(GOOD)
        # the invalid record: quarantined on the service with its reason, acknowledged, gone from the node
        q = os.path.join(site.spool(), spool.QUARANTINE)
        errors = [n for n in os.listdir(q) if n.endswith(".error")]
        assert len(errors) == 1 and "-job-999-" in errors[0], errors
        reason = pathlib.Path(q, errors[0]).read_text()
        assert "unsupported schema 999" in reason and "pushed by uid 0" in reason, reason
        assert json.loads(pathlib.Path(os.path.join(q, errors[0][:-len(".error")])).read_text())["job_id"] == 999
        # the service host's doctor counts it
        doc = run(site.config, "doctor", "--json")
        checks = {c["check"]: c for c in json.loads(doc.stdout)["checks"]}
        assert "1 in quarantine" in checks["spool"]["detail"], checks["spool"]
        # a second pass has nothing to send; the same records pushed again change nothing
        again = run(node, "forward", "--once")
        assert again.returncode == 0, again.stdout
        for job in GOOD:
            spool.write_record(node_spool, make_record(job))  # the records plant wrote
        assert run(node, "forward", "--once").returncode == 0 and pending(node_spool) == 0
        assert sqlite_jobs(db) == list(GOOD)
        assert "stored 4" in pathlib.Path(site.log).read_text()
    finally:
        site.kill(signal.SIGTERM)


class _Tmp(str):
    """What ``plant`` wants of pytest's tmp_path: ``/`` joins."""

    def __truediv__(self, other: str) -> str:
        return os.path.join(self, other)


def test_a_push_without_a_good_root_credential_or_too_large_writes_nothing(munge):
    base, sock, other = munge
    db = os.path.join(base, "service", "gpueff.db")
    site = PushSite(base, f"sqlite:///{db}", sock, service="push_max_mb = 1\n")
    site.start()

    def body(job: int, pad: int = 0) -> bytes:
        rec = synthetic.record(job, cluster="push", gpus=1)
        if pad:
            rec["note"] = "x" * pad
        return json.dumps({"node": "n1", "records": [{"name": f"job-{job}-n1.json", "record": rec}]}).encode()

    def sealed_by(data: bytes, socket: str = sock, user: str | None = None) -> tuple[str, bytes]:
        """(envelope, parts) of ``data`` sealed for root as a client seals a push, by ``user``'s munged client."""
        code = ("import sys; from slurm_gpueff.access import sealed; "
                f"s = sealed.seal(sys.stdin.buffer.read(), 0, {socket!r}, 10); "
                "sys.stdout.write(s.envelope + '\\n'); sys.stdout.buffer.write(s.parts)")
        argv = ["env", f"PYTHONPATH={ROOT}", "/usr/bin/python3", "-c", code]
        out = subprocess.run(["runuser", "-u", user, "--", *argv] if user else argv, input=data, capture_output=True,
                             check=True).stdout
        envelope, _, parts = out.partition(b"\n")
        return envelope.decode(), parts

    def opened(seal: str, data: bytes, user: str | None = None) -> str:
        """A sealed refusal's text, opened by the uid it was sealed for."""
        code = ("import sys; from slurm_gpueff.access import sealed; "
                f"e = sealed.open_envelope(sys.argv[1], {sock!r}, 10); "
                f"sys.stdout.buffer.write(sealed.open_parts(e, sys.stdin.buffer.read(), 1 << 20, {sock!r}, 10))")
        argv = ["env", f"PYTHONPATH={ROOT}", "/usr/bin/python3", "-c", code, seal]
        return subprocess.run(["runuser", "-u", user, "--", *argv] if user else argv, input=data,
                              capture_output=True, check=True).stdout.decode()

    def post(data: bytes, authorization: str | None, user: str | None = None) -> tuple[int, str]:
        c = site.conn()
        headers = {"Content-Type": "application/x-gpueff-sealed"}
        if authorization is not None:
            headers["Authorization"] = authorization
        c.request("POST", "/v1/records", data, headers)
        r = c.getresponse()
        got, seal = r.read(), r.getheader("Gpueff-Seal")
        return r.status, opened(seal, got, user) if seal else got.decode()

    def push(data: bytes, socket: str = sock, user: str | None = None, body: bytes | None = None) -> tuple[int, str]:
        envelope, parts = sealed_by(data, socket, user)
        return post(parts if body is None else body, f"MUNGE {envelope}", user)

    try:
        good = body(1)
        first, parts = sealed_by(good)
        assert post(parts, f"MUNGE {first}")[0] == 200
        refusals = {
            "missing": post(body(2), None),
            "not munge": post(body(3), "Bearer x"),
            "forged": post(body(4), "MUNGE MUNGE:AwQFAAC" + "A" * 100 + ":"),
            "another key": push(body(5), other),
            "replayed": post(parts, f"MUNGE {first}"),
            "another body": push(body(7), body=body(6)),
            "not root": push(body(8), user=USER),
            "oversized": push(body(9, pad=1_200_000)),
        }
        for what, (status, reason) in refusals.items():
            assert status == (413 if what == "oversized" else 401), (what, status, reason)
            assert reason.strip() and "\n" not in reason.strip(), (what, reason)
        assert "may not push records" in refusals["not root"][1]
        assert "replayed" in refusals["replayed"][1]
        assert sqlite_jobs(db) == [1]
        assert not os.path.exists(os.path.join(site.spool(), spool.QUARANTINE)) or \
            os.listdir(os.path.join(site.spool(), spool.QUARANTINE)) == []
        # a forwarder that cannot sign (its munged is down) keeps everything, and says why
        node, node_spool = site.node("node01", munge_socket=os.path.join(base, "nope.sock"))
        spool.write_record(node_spool, synthetic.record(50, cluster="push", gpus=1))
        p = run(node, "forward", "--once")
        assert p.returncode == 1 and "munged" in p.stdout, p.stdout
        assert pending(node_spool) == 1 and sqlite_jobs(db) == [1]
    finally:
        site.kill(signal.SIGTERM)


@pytest.mark.postgres
def test_nothing_lost_or_doubled_across_service_kills_database_outages_and_forwarder_kills(munge):
    base, sock, _other = munge
    cluster = PrivateCluster()
    cluster.start()
    try:
        engine = make_engine(cluster.url, create=False)
        from slurm_gpueff.storage import migrate

        migrate.upgrade(engine)
        site = PushSite(base, cluster.url, sock)
        nodes = [site.node(f"node{i:02d}") for i in range(4)]
        per_node = 400
        for i, (_cfg, node_spool) in enumerate(nodes):
            for j in range(per_node):
                job = 10_000 * (i + 1) + j
                spool.write_record(node_spool, synthetic.record(job, cluster="push", node=f"node{i:02d}", gpus=1,
                                                                timeline_points=2))
        total = per_node * len(nodes)
        site.start()
        logs = [os.path.join(base, f"forward{i}.log") for i in range(len(nodes))]
        fwd = [gpueff(cfg, "forward", "--batch", "20", "-v", log=logs[i]) for i, (cfg, _s) in enumerate(nodes)]

        def left() -> int:
            return sum(pending(s) for _c, s in nodes)

        def wait(cond, what: str, timeout: float = 120) -> None:
            deadline = time.time() + timeout
            while not cond():
                assert time.time() < deadline, f"{what}: {left()} records left"
                time.sleep(0.01)

        # kill -9 of the service in the middle of the pushes, then started again
        wait(lambda: left() < total - 200, "first pushes")
        site.kill()
        assert left() > 0
        time.sleep(1.5)
        site.start()
        # the database down while the nodes push (the service answers 503), then back
        wait(lambda: left() < total * 3 // 4, "pushes after the restart")
        cluster.stop()
        time.sleep(2)
        down_left = left()
        cluster.start()
        # a forwarder killed mid-send, started again
        wait(lambda: left() < down_left - 100 or left() == 0, "pushes after the outage")
        fwd[0].send_signal(signal.SIGKILL)
        fwd[0].wait()
        fwd[0] = gpueff(nodes[0][0], "forward", "--batch", "20", log=logs[0])
        wait(lambda: left() == 0, "the last pushes")
        for p in fwd:
            p.send_signal(signal.SIGTERM)
            assert p.wait(30) == 0
        engine.dispose()  # its pooled connection died with the outage
        with engine.connect() as conn:
            row = conn.execute(text(
                "SELECT count(*), count(DISTINCT (j.job_id, g.node)), (SELECT count(*) FROM job WHERE cluster = 'push')"
                " FROM job_gpu g JOIN job j ON j.id = g.job_pk WHERE j.cluster = 'push'")).one()
        assert tuple(row) == (total, total, total)
        service_log = pathlib.Path(site.log).read_text()
        assert "503" in service_log or "unavailable" in service_log, service_log[-3000:]
        engine.dispose()
    finally:
        if "site" in locals():
            site.kill(signal.SIGTERM)
        for p in locals().get("fwd", []):
            p.kill()
        cluster.destroy()
