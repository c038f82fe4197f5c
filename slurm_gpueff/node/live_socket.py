"""A running job's card from the node agent, up to the second: ``<state_dir>/agent/live.sock``.

``seff-gpu JOBID`` run on the node where the job runs asks here first: the agent takes a reading now and
answers with the job's card so far, so its owner need not wait for the next live record and its ingest.
Anyone may connect (the socket is 0666); the agent learns who asks from the kernel (``SO_PEERCRED``), never
from the request, and the answer function it is given (seff/livecard.py's, handed over by ``gpueff agent``
to node/run.py, which wires the agent's process) applies the privacy rules. seff-gpu, by the same means,
asks only a process of root's there (the agent's account), else the service, which proves itself. The
request is one JSON line ``{"job": "123", "json": false}``; the answer one JSON line, a seff-gpu Answer.
Stdlib only: seff-gpu's client side imports this.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import socketserver

from .. import statedir
from ..access import peer

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    Answerer = Callable[[dict[str, Any], int], dict[str, Any]]

MAX_LINE = 4096
MAX_ANSWER = 16 << 20


AGENT_UID = 0  # the agent runs as root: it reads every job's processes and the GPUs' counters


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5.0

    def handle(self) -> None:
        server: LiveServer = self.server  # type: ignore[assignment]
        try:
            line = self.rfile.readline(MAX_LINE)
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("not an object")
            asker = peer.unix_holder(self.connection)
            if asker is None:
                raise OSError("the kernel does not say who asks")
            answer = server.answer(req, asker.uid)
        except (OSError, ValueError) as exc:
            answer = {"exit_code": 1, "stdout": "", "stderr": f"seff-gpu: bad request to the agent: {exc}\n",
                      "html": []}
        except Exception as exc:  # noqa: BLE001 - one caller's trouble must not reach the agent's loop
            answer = {"exit_code": 1, "stdout": "", "stderr": f"seff-gpu: the agent could not answer: "
                      f"{type(exc).__name__}: {exc}\n", "html": []}
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps(answer).encode() + b"\n")


class LiveServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, answer: Answerer) -> None:
        self.answer = answer
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous agent's socket
        super().__init__(path, _Handler)
        os.chmod(path, 0o666)  # every user may ask; the answer depends on who (SO_PEERCRED)


def ask(state_dir: str, job: str, as_json: bool, timeout_s: float) -> dict[str, Any] | None:
    """The agent's answer for ``job``, or None when no agent answers here (then seff-gpu asks as usual)."""
    path = statedir.live_socket(state_dir)
    if not os.path.exists(path):
        return None
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            agent = peer.unix_holder(s)
            if agent is None or agent.uid != AGENT_UID:  # not the agent: ask the service, which proves itself
                return None
            s.sendall(json.dumps({"job": job, "json": as_json}).encode() + b"\n")
            buf = b""
            while not buf.endswith(b"\n") and len(buf) < MAX_ANSWER:
                chunk = s.recv(65536)
                if not chunk:
                    break
                buf += chunk
        answer = json.loads(buf)
    except (OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None
