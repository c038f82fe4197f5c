"""The state directory's layout (``[paths] state_dir``): everything the hooks, the node agent and the forwarder
keep on a node, named here and nowhere else.

    jobs/<id>.json              a running job's Prolog state, for its Epilog (jobstate.py)
    agent/state.json            the agent's published counters (node/agent.py writes, the backends read)
    agent/timeline/<key>.jsonl  one GPU's (or MIG slice's) timeline, the same
    agent/reading.sock          a hook's request for a reading now (node/tickwire.py, node/run.py)
    agent/live.sock             seff-gpu's running job's card on this node (node/live_socket.py)
    forward.json                the forwarder's heartbeat, for gpueff doctor (node/push.py)
    spool-fallback/             the first node-local fallback of an unwritable spool (spool.py)
    sim/<id>.profile            a simulated job's profile (collectors/simulated.py: the demo, tests)

Stdlib only (hook path).
"""

from __future__ import annotations

import os


def jobs(state_dir: str) -> str:
    """The folder of the running jobs' Prolog states."""
    return os.path.join(state_dir, "jobs")


def job(state_dir: str, job_id: int) -> str:
    """Where the Prolog leaves job ``job_id``'s state for the Epilog."""
    return os.path.join(jobs(state_dir), f"{int(job_id)}.json")


def agent_state(state_dir: str) -> str:
    return os.path.join(state_dir, "agent", "state.json")


def timelines(state_dir: str) -> str:
    """The folder of the agent's timelines."""
    return os.path.join(state_dir, "agent", "timeline")


def timeline(state_dir: str, key: str) -> str:
    """The timeline of a GPU (its UUID) or MIG slice (node.agent_files.mig_key); the key is never a path."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    return os.path.join(timelines(state_dir), f"{safe}.jsonl")


def reading_socket(state_dir: str) -> str:
    return os.path.join(state_dir, "agent", "reading.sock")


def live_socket(state_dir: str) -> str:
    return os.path.join(state_dir, "agent", "live.sock")


def forward_heartbeat(state_dir: str) -> str:
    return os.path.join(state_dir, "forward.json")


def spool_fallback(state_dir: str) -> str:
    return os.path.join(state_dir, "spool-fallback")


def sim_profile(state_dir: str, job_id: int) -> str:
    return os.path.join(state_dir, "sim", f"{job_id}.profile")
