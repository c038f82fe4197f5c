"""seff-gpu on the job's own node: the agent's socket answers with the running job's card up to the second.

The server is the real one (collectors/live_socket.py) with the real answer function the agent is given
(seff/livecard.py), run in this process as the agent runs it; the job's Prolog is the real hook; the GPUs are
simulated. Who asks is what the kernel says (SO_PEERCRED): root here; other uids through the answer function.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hooksite import ROOT, HookSite

from slurm_gpueff import statedir
from slurm_gpueff.config import load
from slurm_gpueff.node import live_socket
from slurm_gpueff.seff.livecard import live_answer

pytestmark = pytest.mark.process  # hooks as slurmd runs them, the agent and seff-gpu as processes


@pytest.fixture
def node(tmp_path):
    site = HookSite(str(tmp_path))
    text = Path(site.config_path).read_text().replace("[paths]\n", f'[paths]\ndatabase = "{tmp_path}/none/gpueff.db"\n')
    with open(site.config_path, "w") as fh:
        fh.write(text)
    site.run("prolog", 77, SLURM_JOB_UID="1000", SLURM_JOB_USER="alice")
    cfg = load(site.config_path)
    os.makedirs(os.path.join(site.state, "agent"), exist_ok=True)
    server = live_socket.LiveServer(statedir.live_socket(site.state), lambda req, uid: live_answer(cfg, req, uid))
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield site, cfg
    finally:
        server.shutdown()
        server.server_close()


def test_the_owner_and_root_get_the_card_so_far_others_are_refused(node):
    _site, cfg = node
    mine = live_answer(cfg, {"job": "77"}, 1000)
    assert mine["exit_code"] == 0 and mine["running"] is True
    assert "RUNNING (figures so far, as of" in mine["stdout"] and "Job ID: 77" in mine["stdout"]
    assert live_answer(cfg, {"job": "77"}, 0)["exit_code"] == 0
    other = live_answer(cfg, {"job": "77"}, 1001)
    assert other["exit_code"] == 6 and other["stdout"] == "" and "77" in other["stderr"]
    assert live_answer(cfg, {"job": "78"}, 1000)["exit_code"] == 3, "not on this node: seff-gpu asks elsewhere"
    assert live_answer(cfg, {"job": "77_1"}, 1000)["exit_code"] == 3
    assert live_answer(cfg, {"job": "x/.."}, 1000)["exit_code"] == 2
    doc = json.loads(live_answer(cfg, {"job": "77", "json": True}, 1000)["stdout"])
    assert doc["jobs"][0]["job"]["running"] is True and len(doc["jobs"][0]["gpus"]) == 2


def test_seff_gpu_on_the_node_asks_the_agent_before_any_database(node):
    site, _cfg = node
    env = dict(os.environ, GPUEFF_CONFIG=site.config_path, PYTHONPATH=ROOT)
    p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "77"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "RUNNING (figures so far, as of" in p.stdout  # there is no database at all: the agent answered
    p = subprocess.run([sys.executable, "-m", "slurm_gpueff.cli.seff", "78"], capture_output=True, text=True,
                       env=env, timeout=60)
    assert p.returncode == 1 and "does not exist yet" in p.stderr, "a job not here: the usual path answers"
    assert oct(os.stat(statedir.live_socket(site.state)).st_mode & 0o777) == "0o666"
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:  # garbage gets one line back, not a hang
        s.settimeout(10)
        s.connect(statedir.live_socket(site.state))
        s.sendall(b"not json\n")
        got = json.loads(s.makefile().readline())
    assert got["exit_code"] == 1 and "bad request" in got["stderr"]


def test_seff_gpu_asks_only_the_agent_s_account_on_the_live_socket():
    """A process of an ordinary user listening where the agent's socket should be (a state dir it could write)
    is not asked: seff-gpu hands it nothing and goes to the service instead. The squatter is a real process of
    the user nobody; the agent's account is root."""
    import shutil
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="gpueff-live-", dir="/tmp"))  # pytest's own tmp is 0700
    state = tmp_path / "state"
    (state / "agent").mkdir(parents=True)
    os.chmod(tmp_path, 0o755)
    os.chmod(state, 0o755)
    os.chmod(state / "agent", 0o777)
    sock = statedir.live_socket(str(state))
    squatter = subprocess.Popen(["runuser", "-u", "nobody", "--", "/usr/bin/python3", "-c", (
        "import socket, sys\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({sock!r}); s.listen(); print('up', flush=True)\n"
        "c, _ = s.accept(); c.settimeout(5)\n"
        "try:\n    data = c.recv(4096)\nexcept OSError:\n    data = b''\n"
        "print('got', len(data), flush=True)\n"
        "c.sendall(b'{\"exit_code\": 0, \"stdout\": \"made up\", \"stderr\": \"\", \"html\": []}\\n')\n")],
        cwd="/", stdout=subprocess.PIPE, text=True)
    try:
        assert squatter.stdout.readline() == "up\n"
        os.chmod(sock, 0o666)
        assert live_socket.ask(str(state), "77", False, 5) is None  # not the agent: not asked
        assert squatter.stdout.readline() == "got 0\n"  # the connection closed, and not a byte came
    finally:
        squatter.kill()
        squatter.wait(10)
        shutil.rmtree(tmp_path, ignore_errors=True)
