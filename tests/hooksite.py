"""A throwaway node for hook tests: config file, spool and state dirs, and a slurmd-like hook runner.

The hooks run as real subprocesses, the way slurmd runs them: environment without PATH or HOME, cwd in
an unrelated directory (slurmd's log dir), root (as on a compute node).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOOKS = os.path.join(ROOT, "hooks")


def make_record(job_id: int, node: str = "node01", gpus: int = 2, cluster: str = "testc",
                start: float = 1.7e9, end: float = 1.7e9 + 3600, **job: Any) -> dict[str, Any]:
    """A valid spool record with measured figures (no hook needed)."""
    from slurm_gpueff.record import empty_gpu

    out = []
    for i in range(gpus):
        g = empty_gpu(i, "simulated", None, minor=i, uuid=f"GPU-{job_id}-{node}-{i}", model="Sim H100",
                      memory_total_bytes=80 * 2**30)
        g.update(kernel_active=0.9, sm_active=0.5 + i / 100, tensor_active=0.3, energy_j=1000.0 + i,
                 power_mean_w=300.0, memory_used_peak_bytes=2**30, samples=10,
                 timeline=[[30.0, 0.9, 0.5, 0.3], [90.0, 0.8, 0.4, 0.2]])
        out.append(g)
    rec = {"schema": 1, "cluster": cluster, "node": node, "job_id": job_id, "user": "alice", "uid": 1000,
           "account": "proj", "partition": "gpu", "start_time": start, "end_time": end, "exit_code": 0,
           "signal": 0, "backend": "simulated", "reason": None, "gpus": out, "written_at": end,
           "writer": "test"}
    rec.update(job)
    return rec


class HookSite:
    """Config + dirs under ``base``; ``run(kind, job_id, ...)`` executes hooks/<kind> like slurmd."""

    def __init__(self, base: str, backend: str = "simulated", **extra: dict[str, Any]):
        self.base = base
        self.spool = os.path.join(base, "spool")
        self.state = os.path.join(base, "state")
        self.logdir = os.path.join(base, "slurmd-log")
        self.tmpdir = os.path.join(base, "tmp")
        for d in (self.logdir, self.tmpdir):
            os.makedirs(d, exist_ok=True)
        self.config_path = os.path.join(base, "gpueff.toml")
        self.write_config(backend=backend, **extra)

    def write_config(self, backend: str = "simulated", text: str | None = None,
                     **extra: dict[str, Any]) -> None:
        if text is None:
            sections: dict[str, dict[str, Any]] = {
                "site": {"cluster": "cfgcluster"},
                "paths": {"spool_dir": self.spool, "state_dir": self.state},
                "collector": {"backend": backend},
            }
            for name, values in extra.items():
                sections.setdefault(name, {}).update(values)
            lines = []
            for name, values in sections.items():
                lines.append(f"[{name}]")
                lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
            text = "\n".join(lines) + "\n"
        with open(self.config_path, "w") as fh:
            fh.write(text)

    def env(self, job_id: int | str, gpus: str | None = "0,1", **extra: str) -> dict[str, str]:
        env = {"SLURM_JOB_ID": str(job_id), "SLURMD_NODENAME": "node01", "SLURM_CLUSTER_NAME": "testc",
               "SLURM_JOB_USER": "alice", "SLURM_JOB_UID": "1000", "SLURM_JOB_GID": "1000",
               "SLURM_JOB_PARTITION": "gpu", "SLURM_NODELIST": "node01", "SLURM_JOB_NUM_NODES": "1",
               "GPUEFF_CONFIG": self.config_path, "TMPDIR": self.tmpdir}
        if gpus is not None:
            env["SLURM_JOB_GPUS"] = gpus
            env["CUDA_VISIBLE_DEVICES"] = gpus
        env.update(extra)
        return env

    def run(self, kind: str, job_id: int | str, *, env: dict[str, str] | None = None, timeout: float = 60,
            hooks: str = HOOKS, python: str = sys.executable, user: str | None = None,
            **extra: str) -> tuple[subprocess.CompletedProcess, float]:
        """Run <hooks>/<kind> with a slurmd-like environment, as ``user`` if given (needs root); return
        (process, wall seconds)."""
        e = env if env is not None else self.env(job_id, **extra)
        if kind == "epilog":
            e.setdefault("SLURM_JOB_EXIT_CODE2", "0:0")
            e.setdefault("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
        as_user: dict[str, Any] = {}
        if user is not None:
            as_user = {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}
        t = time.monotonic()
        p = subprocess.run([python, os.path.join(hooks, kind)], env=e, cwd=self.logdir, capture_output=True,
                           text=True, timeout=timeout, **as_user)
        return p, time.monotonic() - t

    def incoming(self, spool: str | None = None) -> list[str]:
        d = os.path.join(spool or self.spool, "incoming")
        try:
            return sorted(os.path.join(d, n) for n in os.listdir(d) if not n.startswith("."))
        except FileNotFoundError:
            return []

    def record(self, job_id: int, node: str = "node01", spool: str | None = None) -> dict[str, Any]:
        with open(os.path.join(spool or self.spool, "incoming", f"job-{job_id}-{node}.json")) as fh:
            return json.load(fh)

    def state_file(self, job_id: int) -> str:
        return os.path.join(self.state, "jobs", f"{job_id}.json")
