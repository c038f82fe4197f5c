"""The forwarder against a real PostgreSQL that goes down and comes back: nothing lost, nothing doubled.

The cluster is a private ``initdb`` one on its own port (pgutil.PrivateCluster), so stopping it leaves
the machine's shared server alone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
import synthetic
from pgutil import PrivateCluster
from sqlalchemy import text

from slurm_gpueff import spool
from slurm_gpueff.storage import migrate
from slurm_gpueff.storage.db import make_engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.process  # its tests start real processes (CLI commands, hooks, services)
N = 1000


@pytest.fixture(scope="module")
def cluster():
    c = PrivateCluster()
    c.start()
    yield c
    c.destroy()


def write_config(tmp_path, url: str) -> str:
    path = tmp_path / "gpueff.toml"
    path.write_text(f'[paths]\nspool_dir = "{tmp_path}/spool"\nstate_dir = "{tmp_path}/state"\n'
                    f'database = "{url}"\n[service]\nforward_interval_s = 0.2\nforward_max_backoff_s = 0.5\n')
    return str(path)


def forward(config: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "slurm_gpueff.cli.gpueff", "--config", config, "forward", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def counts(url: str, cluster: str) -> tuple[int, int, int]:
    engine = make_engine(url, create=False)
    with engine.connect() as conn:
        row = conn.execute(text(
            "SELECT (SELECT count(*) FROM job WHERE cluster = :c), (SELECT count(DISTINCT job_id) FROM job "
            "WHERE cluster = :c), (SELECT count(*) FROM job_gpu g JOIN job j ON j.id = g.job_pk WHERE j.cluster = :c)"),
            {"c": cluster}).one()
    engine.dispose()
    return tuple(row)


def spool_records(spool_dir: str, cluster: str) -> None:
    for i in range(N):
        spool.write_record(spool_dir, synthetic.record(i + 1, cluster=cluster, gpus=1, timeline_points=2))


def pending(spool_dir: str) -> int:
    return sum(1 for n in os.listdir(os.path.join(spool_dir, "incoming")) if n.endswith(".json"))


@pytest.mark.postgres
def test_db_down_then_up_then_replay_then_kill9(cluster, tmp_path):
    url = cluster.url
    migrate.upgrade(make_engine(url, create=False))
    config = write_config(tmp_path, url)
    spool_dir = str(tmp_path / "spool")

    # 1. The database is down while 1,000 jobs end: every record stays in the spool.
    cluster.stop()
    spool_records(spool_dir, "down")
    p = forward(config, "--once")
    out, _ = p.communicate(timeout=120)
    assert p.returncode == 1, out
    assert pending(spool_dir) == N

    # 2. A forwarder loop keeps retrying; the database comes back; exactly 1,000 jobs arrive.
    p = forward(config)
    time.sleep(1.0)
    cluster.start()
    deadline = time.time() + 90
    while pending(spool_dir) and time.time() < deadline:
        time.sleep(0.2)
    p.send_signal(signal.SIGTERM)
    out, _ = p.communicate(timeout=30)
    assert p.returncode == 0, out
    assert pending(spool_dir) == 0
    assert counts(url, "down") == (N, N, N)

    # 3. The same 1,000 records replayed (a restored spool backup, a crash before the unlinks): still 1,000.
    spool_records(spool_dir, "down")
    p = forward(config, "--once")
    p.communicate(timeout=120)
    assert p.returncode == 0 and pending(spool_dir) == 0
    assert counts(url, "down") == (N, N, N)

    # 4. kill -9 in the middle of forwarding new records, then forward again: exactly 1,000.
    spool_records(spool_dir, "kill")
    p = forward(config, "--once", "--batch", "10")
    deadline = time.time() + 60
    while pending(spool_dir) > N - 50 and p.poll() is None and time.time() < deadline:
        time.sleep(0.002)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    left = pending(spool_dir)
    assert 0 < left < N, f"the kill did not land mid-forward ({left} left)"
    assert counts(url, "kill")[0] < N
    p = forward(config, "--once")
    p.communicate(timeout=120)
    assert p.returncode == 0 and pending(spool_dir) == 0
    assert counts(url, "kill") == (N, N, N)
    assert counts(url, "down") == (N, N, N)


def test_forward_refuses_sqlite_with_a_pointer_to_the_shared_spool(tmp_path):
    config = write_config(tmp_path, f"sqlite:///{tmp_path}/x.db")
    p = forward(config, "--once")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 2 and "shared spool" in out
