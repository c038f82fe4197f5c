"""The hooks' request for a reading taken now, and the agent's answer (a Unix socket in the state dir).

A job's figures are differences of the agent's cumulative counters between a reading at the Prolog and one
at the Epilog. Left to its own schedule the agent's last reading can be up to one interval old at either
end, and the end it loses is where the job was working; so each hook asks the running agent to take a
reading at once and waits for it, bounded by ``collector.tick_wait_s``. If no answer comes the hook uses the
last reading and records how old it was (docs/FIGURES.md "The job's window").

This is the client (stdlib only, cheap to import, never raises: the hook path); the agent's side is in
:mod:`slurm_gpueff.node.run`.
"""

from __future__ import annotations

import json
import socket
import time

from .. import statedir

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

REQUEST = b"reading\n"
MAX_LINE = 256


def request_reading(state_dir: str, timeout_s: float) -> tuple[dict[str, Any] | None, str | None]:
    """Ask the agent for a reading now and wait for it: (its answer, None), else (None, why not)."""
    if timeout_s <= 0:
        return None, "immediate readings are off (collector.tick_wait_s = 0)"
    path = statedir.reading_socket(state_dir)
    deadline = time.monotonic() + timeout_s
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(REQUEST)
            data = b""
            while not data.endswith(b"\n") and len(data) < 4096:
                s.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except FileNotFoundError:
        return None, "the agent takes no requests (no socket: agent not running, or older than this hook)"
    except TimeoutError:
        return None, f"the agent did not answer within {timeout_s:g} s"
    except OSError as exc:
        return None, f"cannot ask the agent for a reading ({exc.strerror or exc})"
    try:
        answer = json.loads(data)
    except ValueError:
        return None, "the agent's answer was cut short or unreadable"
    if not isinstance(answer, dict) or answer.get("error"):
        why = answer.get("error") if isinstance(answer, dict) else None
        return None, f"the agent took no reading: {why or 'unexpected answer'}"
    return answer, None
