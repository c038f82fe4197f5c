#!/usr/bin/env python3
"""Snapshots of slurm-gpueff's user-visible outputs, to prove a refactor changes none of them byte for byte.

    python3 tools/snapshot.py render TREE OUT        # TREE: a checkout; OUT: a new folder of output files
    python3 tools/snapshot.py diff A B               # two renders: files only in one, files that differ
    python3 tools/snapshot.py both REV_A REV_B OUT   # worktrees of two revisions, rendered, diffed, removed

``render`` installs TREE (not editable: its own copy) into a venv of its own, ``OUT/../venv-<OUT's name>``
(made once, with TREE's dependencies; TREE itself reinstalled at every render), builds a fixed input in a
fresh work folder ``OUT/../work-<OUT's name>`` and runs the product's commands on it as real processes, each
output written to one file under OUT (``inputs.txt`` lists every command and its file). Every process it
starts gets:

- a pinned wall clock: ``tools/snapclock.c``, compiled with gcc into OUT's parent on first use and
  LD_PRELOADed, makes ``time()``, ``gettimeofday()`` and ``clock_gettime(CLOCK_REALTIME[_COARSE])`` read
  :data:`EPOCH` (frozen; ``gpueff serve`` gets a running clock from :data:`EPOCH`); monotonic clocks, and so
  timeouts and sleeps, are the real ones;
- its own HOME, config (``GPUEFF_CONFIG`` and ``--config``: nothing under /etc/slurm-gpueff or
  /var/lib/slurm-gpueff is read or written), spool, state and report folders under the work folder;
- ``TZ=UTC``, ``LC_ALL=C.UTF-8``, ``COLUMNS=100`` (argparse's help width), ``PYTHONHASHSEED=0``, a PATH of
  the venv and /usr/bin:/bin only (so no ``sacct``: accounting is fed in-process, below).

The input (built by TREE's own code and commands): ``gpueff demo`` (nine jobs through the real hooks and
ingest, enriched by its simulated accounting), then spool records made with TREE's simulated collector and put
through ``gpueff ingest``: healthy, idle, memory-bound, short, failed, timed out, cancelled, node-failed with
no start state, an 8-GPU job using one GPU, a job without GPUs, an array (3 tasks) and a heterogeneous job, two
jobs sharing a GPU (NVML per-process split) and one under MPS, a window with agent gaps, GPUs without GPM, a
user name and account holding HTML and control characters, jobs last month, enriched and not; a running job
(the real Prolog, then ``gpueff live``); enrichment through ``storage.enrich.enrich_jobs`` with a scripted
accounting (as the demo does), then ``gpueff rollup --full``. ``inputs/db-*.txt`` dumps the database's job
rows, so a changed input shows in the diff as such.

The outputs: seff-gpu's card (text, ``--json``, ``--html``) of every job and id form (array, task, het,
raw), its tables (``-u``, ``-A``, both, ``-s``, ``-S``/``-E``, ``--limit``, ``--json``), ``gpueff report
cards|monthly --dry-run`` (each message's .eml, text and HTML parts as the product writes them), ``report
status|optout|retry``, ``gpueff alerts run --dry-run`` and ``alerts log``, ``gpueff serve``'s ``/metrics`` (on
a copy of the database), ``config check``, ``doctor`` (every role), ``db current|check``, ``version``,
``ingest``, ``rollup``, ``live``, ``demo``, every command's ``--help``, and error cases (bad and unknown ids,
bad usage, removed options and config keys, a config that does not parse) with their stderr and exit status.
A file whose command wrote to stderr or exited non-zero ends with ``--- stderr ---`` and ``--- exit N ---``.

Normalised, and only these: the work folder's, the venv's and this tool's absolute paths (``<WORK>``,
``<VENV>``: where this tool put them; ``<TOOLS>``: where it lies), the ``Message-ID`` and MIME boundaries of
mail (random per run),
``/metrics``' ``process_*``/``python_gc_*`` lines (the Python process's own memory, CPU and start time).

Not covered: seff-gpu through the service's MUNGE path (it runs as root, who reads the database directly: the
same Answer, another transport), real mail delivery over SMTP (the dry-run writes the messages the mailer
would send), the node agent (needs NVML; its per-job metrics are not rendered), ``--watch``, PostgreSQL and
``db copy``, Slurm's real ``sacct``/``sacctmgr`` (``gpueff enrich`` and ``backfill`` show their error here).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
EPOCH = 1_795_003_200  # 2026-11-18T12:00:00Z, the wall clock of every process started
DAY = 86400.0
HOUR = 3600.0
CLUSTER = "demo"
DIFF_CAP = 200  # lines of unified diff shown per differing file
EVIL_USER = "<b>mallory</b>\x1b[31m&\x07"
EVIL_ACCOUNT = "acc<&>\x1b]0;x"


# ----------------------------------------------------------------------------------------------------------
# The input: run by TREE's venv python as `snapshot.py _input CONFIG` (imports TREE's slurm_gpueff)


@dataclass
class Job:
    job_id: int
    profile: str
    user: str
    account: str
    gpus: int = 1
    hours: float = 1.0
    ago_h: float = 3.0  # hours before EPOCH the job ended
    state: str | None = "COMPLETED"  # what accounting says (None: not enriched)
    exit_code: int = 0
    extra: dict[str, Any] = field(default_factory=dict)
    gpu_patch: Callable[[list[dict[str, Any]]], None] | None = None


def _shared(with_job: int, share: float, method: str) -> Callable[[list[dict[str, Any]]], None]:
    def patch(gpus: list[dict[str, Any]]) -> None:
        gpus[0]["shared"] = {"with": [str(with_job)], "with_count": 1, "method": method, "share": share,
                             "shared_s": 3000.0, "unattributed": 0.05, "gpu_kernel_active": 0.9}
    return patch


def _mps(gpus: list[dict[str, Any]]) -> None:
    g = gpus[0]
    for k in ("kernel_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active", "energy_j",
              "power_mean_w"):
        g[k] = None
        g.setdefault("missing", {})[k] = "MPS: NVML credits every client's kernels to the MPS server"
    g["shared"] = {"with": ["5021"], "with_count": 1, "method": "mps", "share": 0.5, "shared_s": 3600.0,
                   "unattributed": None, "unmeasured_s": 3600.0, "gpu_kernel_active": None}


def _gaps(gpus: list[dict[str, Any]]) -> None:
    end = EPOCH - 5 * HOUR
    start = end - 2 * HOUR
    for g in gpus:
        g["window_s"] = 2 * HOUR
        g["measured_s"] = 2 * HOUR - 900.0
        g["window"] = {"start": start, "end": end, "start_offset_s": 0.0, "end_offset_s": 0.0,
                       "start_exact": True, "end_exact": True,
                       "gaps": [[start + 1200.0, start + 1800.0, "agent not running (killed or crashed)"],
                                [start + 4000.0, start + 4300.0, "agent restarted"]], "break": None}


def _no_gpm(gpus: list[dict[str, Any]]) -> None:
    for g in gpus:
        for k in ("sm_active", "sm_occupancy", "tensor_active", "dram_active", "fp64_active", "fp32_active",
                  "fp16_active", "hmma_active", "imma_active", "dfma_active"):
            g[k] = None
            g.setdefault("missing", {})[k] = "GPU has no GPM metrics (pre-Hopper)"
        g["source"] = "nvml"
        g["model"] = "NVIDIA A100-SXM4-80GB"


def input_jobs() -> list[Job]:
    """The jobs added beside the demo's (ids 5001 on; the demo's are 4201-4209)."""
    last_month = (EPOCH - 20 * DAY - EPOCH % DAY) / HOUR  # 20 days back: November's first half / October
    return [
        Job(5001, "bf16-healthy", "alice", "vision", gpus=2, hours=4.0, ago_h=2.0),
        Job(5002, "idle", "bob", "genomics", hours=3.0, ago_h=5.0, state=None),
        Job(5003, "bf16-healthy", "alice", "vision", hours=30 / 3600, ago_h=1.0),
        Job(5004, "starved", "carol", "physics", hours=1.5, ago_h=8.0, state="FAILED", exit_code=1),
        Job(5005, "memory-bound", "dave", "physics", hours=12.0, ago_h=20.0, state="TIMEOUT"),
        Job(5006, "tiny-kernels", "erin", "chemistry", hours=2.0, ago_h=30.0, state="CANCELLED",
            extra={"exit_code": 0, "signal": 15}),
        Job(5007, "bf16-healthy", "alice", "vision", hours=1.0, ago_h=4.0,
            gpu_patch=_shared(5008, 0.5, "NVML per-process SM utilization; processes by Slurm cgroup")),
        Job(5008, "oversized", "bob", "genomics", hours=1.0, ago_h=4.0, state=None,
            gpu_patch=_shared(5007, 0.5, "NVML per-process SM utilization; processes by Slurm cgroup")),
        Job(5009, "bf16-healthy", "frank", "vision", hours=1.0, ago_h=6.0, gpu_patch=_mps),
        Job(5010, "fp32-no-tensor", "alice", "vision", hours=2.0, ago_h=5.0, gpu_patch=_gaps),
        Job(5011, "one-sm-spin", EVIL_USER, EVIL_ACCOUNT, hours=2.0, ago_h=3.0),
        Job(5012, "idle", EVIL_USER, EVIL_ACCOUNT, hours=5.0, ago_h=26.0, state=None),
        Job(5013, "bf16-healthy", "alice", "vision", hours=2.0, ago_h=9.0, gpu_patch=_no_gpm),
        Job(5014, "one-of-n-gpus", "dave", "physics", gpus=8, hours=3.0, ago_h=12.0),
        Job(5015, "bf16-healthy", "carol", "physics", gpus=0, hours=1.0, ago_h=7.0),
        Job(5016, "fp64-dgemm", "erin", "chemistry", hours=2.0, ago_h=15.0,
            extra={"array_job_id": 5016, "array_task_id": 0}),
        Job(5017, "int8-gemm", "erin", "chemistry", hours=2.0, ago_h=15.0,
            extra={"array_job_id": 5016, "array_task_id": 1}),
        Job(5018, "idle", "erin", "chemistry", hours=2.0, ago_h=15.0, state=None,
            extra={"array_job_id": 5016, "array_task_id": 2}),
        Job(5019, "bf16-healthy", "bob", "genomics", hours=3.0, ago_h=40.0,
            extra={"het_job_id": 5019, "het_job_offset": 0}),
        Job(5020, "memory-bound", "bob", "genomics", hours=3.0, ago_h=40.0,
            extra={"het_job_id": 5019, "het_job_offset": 1}),
        Job(5021, "bf16-healthy", "frank", "vision", hours=1.0, ago_h=6.0, gpu_patch=_mps),
        Job(5022, "starved", "alice", "vision", hours=6.0, ago_h=last_month),
        Job(5023, "bf16-healthy", "bob", "genomics", hours=10.0, ago_h=last_month + 30.0),
        Job(5024, "idle", "carol", "physics", hours=4.0, ago_h=last_month + 200.0, state="COMPLETED"),
        Job(5025, "oversized", "dave", "physics", hours=2.0, ago_h=3.0, state="NODE_FAIL",
            extra={"reason": "no Prolog state for this job (the node rebooted): start time unknown"}),
        Job(5026, "bf16-healthy", "alice", "vision", gpus=4, hours=8.0, ago_h=50.0, state="OUT_OF_MEMORY",
            exit_code=0),
    ]


FAKE_SLURM = """#!/usr/bin/python3
# Slurm's commands for the snapshot's site: squeue knows the running jobs; sacct, sacctmgr, scontrol fail.
import os, sys
RUNNING = {running!r}
name, args = os.path.basename(sys.argv[0]), sys.argv[1:]
if name != "squeue":
    sys.exit(f"{{name}}: error: Unable to contact slurm controller (snapshot: no Slurm here)")
ids = args[args.index("-j") + 1].replace("_", ",").split(",") if "-j" in args else list(RUNNING)
for i in ids:
    if i in RUNNING:
        user, account = RUNNING[i]
        print(f"{{i}} 1 gpu normal RUNNING 0" if "-O" in args else f"RUNNING|{{user}}|{{account}}")
"""

RUNNING = [(5101, "idle", "bob", "genomics", 1, 2.0), (5102, "bf16-healthy", "alice", "vision", 2, 0.5)]


def _record(job: Job) -> dict[str, Any]:
    from slurm_gpueff.collectors.base import JobContext
    from slurm_gpueff.collectors.simulated import SimulatedCollector
    from slurm_gpueff.config import Config

    end = EPOCH - job.ago_h * HOUR
    start = end - job.hours * HOUR
    ctx = JobContext(job.job_id, "gpu-node03", CLUSTER, list(range(job.gpus)), start_time=start, end_time=end,
                     env={"GPUEFF_SIM_PROFILE": job.profile})
    col = SimulatedCollector(Config())
    meas = col.stop(ctx, col.start(ctx))
    gpus = [dict(g) for g in meas.gpus]
    if job.gpu_patch is not None:
        job.gpu_patch(gpus)
    rec: dict[str, Any] = {"schema": 1, "cluster": CLUSTER, "node": "gpu-node03", "job_id": job.job_id,
                           "start_time": start, "end_time": end, "backend": meas.backend, "reason": meas.reason,
                           "gpus": gpus, "user": job.user, "uid": 3000 + job.job_id % 100,
                           "account": job.account, "partition": "gpu", "exit_code": job.exit_code, "signal": 0}
    rec.update(job.extra)
    return rec


class Accounting:
    """The input's ``sacct``: each enriched job's final state, as the demo's SimulatedAccounting answers."""

    batch_size = 500

    def __init__(self, jobs: list[Job]) -> None:
        self.by_id = {j.job_id: j for j in jobs if j.state is not None}

    def jobs(self, ids: list[int], cluster: str | None = None, runs: bool = False) -> list[Any]:
        from slurm_gpueff.slurm.sacct import SacctJob

        out = []
        for i in ids:
            j = self.by_id.get(i)
            if j is None:
                continue
            text = str(i)
            if "array_job_id" in j.extra:
                text = f"{j.extra['array_job_id']}_{j.extra['array_task_id']}"
            if "het_job_id" in j.extra:
                text = f"{j.extra['het_job_id']}+{j.extra['het_job_offset']}"
            state_text = "CANCELLED by 3006" if j.state == "CANCELLED" else j.state
            out.append(SacctJob(job_id=i, job_id_text=text, cluster=cluster, state=j.state, state_text=state_text,
                                exit_code=j.exit_code, signal=j.extra.get("signal", 0), run=0, source="simulated",
                                **{k: v for k, v in j.extra.items() if k in ("array_job_id", "array_task_id",
                                                                              "het_job_id", "het_job_offset")}))
        return out


def make_input(config_path: str, phase: str) -> None:
    """``records``: the extra jobs' records into the spool; ``enrich``: enrichment and summaries."""
    from slurm_gpueff import spool
    from slurm_gpueff.config import load

    config = load(config_path)
    jobs = input_jobs()
    if phase == "records":
        for job in jobs:
            spool.write_record(config.paths.spool_dir, _record(job))
        return
    from slurm_gpueff.service.summarize import summarize_pending
    from slurm_gpueff.storage.db import make_engine
    from slurm_gpueff.storage.enrich import enrich_jobs

    engine = make_engine(config.paths.database)
    try:
        res = enrich_jobs(engine, Accounting(jobs), settle_s=0.0)
        summarize_pending(engine, config.analysis)
    finally:
        engine.dispose()
    print(f"enriched: {getattr(res, 'enriched', res)}")


# ----------------------------------------------------------------------------------------------------------
# Rendering


CONFIG = """[site]
cluster = "demo"

[paths]
spool_dir = "{work}/spool"
state_dir = "{work}/run"
database = "sqlite:///{db}"

[collector]
backend = "simulated"

[simulated]
model = "Simulated H100 80GB"

[privacy]
enabled = true

[mail]
from_address = "gpueff@example.org"
dry_run = true

[reports]
dir = "{work}/reports"
cards = true
address_pattern = "{{user}}@example.org"
card_min_gpu_hours = 0.0
card_only_unhealthy = false
card_max_per_user_per_day = 50
card_lookback_h = 1000.0
monthly = true
coordinators_as_leads = false
admins = ["hpc-admins@example.org"]
price_per_gpu_hour = {{ vision = 1.5, physics = 2.0 }}
contact = "hpc-help@example.org"

[leads]
vision = ["alice"]
physics = ["carol", "dave"]

[alerts]
enabled = true
dry_run = true
window_min = 30.0
grace_min = 0.0
stale_min = 10080.0

[sacct]
command = "{work}/slurmbin/sacct"

[service]
metrics_address = "127.0.0.1"
metrics_port = {port}
{extra}"""

# (section, line): the line put into the render's own config, in that section (so that the rest of the config,
# the database included, stays the render's own); section "" replaces the whole file.
BAD_CONFIGS: dict[str, tuple[str, str]] = {
    "unknown-key": ("paths", 'spool_dirr = "/x"'),
    "unknown-section": ("nonsense", "a = 1"),
    "bad-type": ("service", 'metrics_port = "many"'),
    "not-toml": ("", "[paths\nspool_dir = \n"),
    "removed-ingest-workers": ("service", "ingest_workers = 4"),
    "removed-gpus-per-node": ("simulated", "gpus_per_node = 8"),
    "removed-plugins": ("service", 'plugins = ["x"]'),
    "bad-threshold": ("analysis", "busy_sm_pct = 250.0"),
}
# Figures of the host, not of the product: a duration measured with the real clock, a filesystem's free space.
VOLATILE = [(re.compile(r"(\d+ rows, )\d+\.\d+ s\)"), r"\1<T> s)"),
            (re.compile(r"\d+(\.\d+)? ([KMGT]iB) free"), r"<N> \2 free"),
            (re.compile(r'("free_bytes": )\d+'), r"\1<N>")]


@dataclass
class Renderer:
    tree: Path
    out: Path
    venv: Path
    work: Path
    clock: Path
    inputs: list[str] = field(default_factory=list)
    port: int = 0

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def config(self) -> Path:
        return self.work / "gpueff.toml"

    def env(self, rate: float = 0.0) -> dict[str, str]:
        return {"PATH": f"{self.bin}:/usr/bin:/bin", "HOME": str(self.work / "home"), "TZ": "UTC",
                "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8", "COLUMNS": "100", "PYTHONHASHSEED": "0",
                "PYTHONDONTWRITEBYTECODE": "1", "MPLCONFIGDIR": str(self.work / "home" / "mpl"),
                "GPUEFF_CONFIG": str(self.config), "LD_PRELOAD": str(self.clock),
                "SNAPCLOCK_EPOCH": str(EPOCH), "SNAPCLOCK_RATE": str(rate), "USER": "root", "LOGNAME": "root"}

    def normalise(self, text: str) -> str:
        text = text.replace(str(self.work), "<WORK>").replace(str(self.venv), "<VENV>")
        text = text.replace(str(HERE), "<TOOLS>")  # where this checkout of the tool lies
        for pattern, repl in VOLATILE:
            text = pattern.sub(repl, text)
        return text

    def write(self, name: str, data: str | bytes) -> None:
        path = self.out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, str):
            path.write_text(self.normalise(data), encoding="utf-8", errors="surrogateescape")
        else:
            path.write_bytes(self.normalise(data.decode("utf-8", "surrogateescape")).encode("utf-8",
                                                                                             "surrogateescape"))

    def run(self, name: str | None, argv: Sequence[str], *, env: dict[str, str] | None = None,
            timeout: float = 120.0, stdin: str | None = None) -> tuple[int, str, str]:
        """Run ``argv`` (its first word a command of the venv) pinned; its output into ``name`` (None: not kept)."""
        cmd = [str(self.bin / argv[0]) if (self.bin / argv[0]).exists() else argv[0], *argv[1:]]
        try:
            proc = subprocess.run(cmd, env=env or self.env(), cwd=self.work, capture_output=True,
                                  timeout=timeout, input=stdin.encode() if stdin is not None else None)
            rc, out, err = (proc.returncode, proc.stdout.decode("utf-8", "surrogateescape"),
                            proc.stderr.decode("utf-8", "surrogateescape"))
        except subprocess.TimeoutExpired:
            rc, out, err = 124, "", f"(snapshot: timed out after {timeout} s)\n"
        text = out
        if err or rc != 0:
            text += f"--- stderr ---\n{err}--- exit {rc} ---\n"
        if name is not None:
            self.write(name, text)
            self.inputs.append(self.normalise(f"{name}\t{' '.join(_quote(a) for a in argv)}"))
        return rc, out, err

    def seff(self, name: str, *args: str) -> tuple[int, str, str]:
        return self.run(name, ["seff-gpu", "--config", str(self.config), *args])

    def gpueff(self, name: str | None, *args: str, timeout: float = 120.0) -> tuple[int, str, str]:
        return self.run(name, ["gpueff", "--config", str(self.config), *args], timeout=timeout)

    # -- steps ----------------------------------------------------------------------------------------------

    def build_input(self) -> None:
        demo = self.work / "demo"
        slurmbin = self.work / "slurmbin"
        slurmbin.mkdir()
        running = {str(j): (u, a) for j, _, u, a, _, _ in RUNNING}
        for name in ("sacct", "squeue", "sacctmgr", "scontrol"):
            (slurmbin / name).write_text(FAKE_SLURM.format(running=running))
            (slurmbin / name).chmod(0o755)
        self.run("demo/demo.txt", ["gpueff", "demo", "--dir", str(demo)], timeout=600)
        shutil.copy(demo / "gpueff.db", self.work / "gpueff.db")
        self.config.write_text(CONFIG.format(work=self.work, db=self.work / "gpueff.db", port=self.port, extra=""))
        me = str(Path(__file__).resolve())
        py = str(self.bin / "python")
        _must(self.run("inputs/records.txt", [py, me, "_input", str(self.config), "records"]))
        _must(self.gpueff("admin/ingest.txt", "ingest"))
        # running jobs: the real Prolog (simulated collector), then one `gpueff live` pass, then ingest
        for job_id, profile, user, account, gpus, hours in RUNNING:
            env = self.env() | _slurm_env(job_id, user, account, gpus, EPOCH - hours * HOUR, profile)
            self.run(f"inputs/prolog-{job_id}.txt", ["gpueff", "hook", "prolog"], env=env)
        self.gpueff("admin/live.txt", "live", "-v")
        self.gpueff("admin/ingest-live.txt", "ingest")
        _must(self.run("inputs/enrich.txt", [py, me, "_input", str(self.config), "enrich"]))
        self.gpueff("admin/rollup-full.txt", "rollup", "--full")
        self.gpueff("admin/rollup.txt", "rollup")
        self.dump_db("inputs/db-after-input.txt")

    def dump_db(self, name: str) -> None:
        con = sqlite3.connect(f"file:{self.work / 'gpueff.db'}?mode=ro", uri=True)
        try:
            lines = []
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
            for t in tables:
                cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
                rows = con.execute(f'SELECT * FROM "{t}"').fetchall()
                lines.append(f"## {t} ({len(rows)} rows): {', '.join(cols)}")
                if t != "job_gpu_timeline" or len(rows) <= 50:
                    for r in sorted(rows, key=repr):
                        lines.append(repr(tuple(_short(v) for v in r)))
            self.write(name, "\n".join(lines) + "\n")
        finally:
            con.close()

    def job_ids(self) -> list[str]:
        con = sqlite3.connect(f"file:{self.work / 'gpueff.db'}?mode=ro", uri=True)
        try:
            ids = sorted({r[0] for r in con.execute("SELECT job_id FROM job")})
        finally:
            con.close()
        return [str(i) for i in ids]

    def cards(self) -> None:
        html = self.work / "html"
        html.mkdir()
        for jid in self.job_ids():
            self.seff(f"cards/seff-gpu-{jid}.txt", jid)
            self.seff(f"cards/seff-gpu-{jid}.json", "--json", jid)
            page = html / f"{jid}.html"
            self.seff(f"cards/seff-gpu-{jid}.html.stdout.txt", "--html", str(page), jid)
            if page.exists():
                self.write(f"cards/seff-gpu-{jid}.html", page.read_bytes())
        for form in ("5016", "5016_1", "5016_2", "5019", "5019+1", "5019+0", "4201.batch", "5016_1.batch"):
            self.seff(f"cards/id-{form}.txt", form)
            self.seff(f"cards/id-{form}.json", "--json", form)
        self.seff("cards/cluster-demo-4201.txt", "--cluster", "demo", "4201")
        self.seff("cards/cluster-other-4201.txt", "--cluster", "other", "4201")
        # --html onto an existing file: refused, then --force
        page = html / "5001.html"
        self.seff("errors/seff-html-exists.txt", "--html", str(page), "5001")
        self.seff("cards/seff-gpu-5001-html-force.stdout.txt", "--html", str(page), "--force", "5001")

    def tables(self) -> None:
        users = ["alice", "bob", "carol", "dave", "erin", "frank", EVIL_USER, "nobody"]
        accounts = ["vision", "genomics", "physics", "chemistry", EVIL_ACCOUNT]
        for u in users:
            tag = _tag(u)
            self.seff(f"tables/seff-gpu-u-{tag}.txt", "-u", u)
            self.seff(f"tables/seff-gpu-u-{tag}.json", "-u", u, "--json")
            self.seff(f"tables/seff-gpu-u-{tag}-30d.txt", "-u", u, "-S", "now-30days")
        for a in accounts:
            tag = _tag(a)
            self.seff(f"tables/seff-gpu-A-{tag}.txt", "-A", a)
            self.seff(f"tables/seff-gpu-A-{tag}.json", "-A", a, "--json")
        self.seff("tables/seff-gpu-u-alice-A-vision.txt", "-u", "alice", "-A", "vision")
        self.seff("tables/seff-gpu-u-bob-A-vision.txt", "-u", "bob", "-A", "vision")
        self.seff("tables/seff-gpu-u-alice-running.txt", "-u", "alice", "-s", "RUNNING")
        self.seff("tables/seff-gpu-u-bob-running.json", "-u", "bob", "-s", "RUNNING", "--json")
        self.seff("tables/seff-gpu-A-physics-failed.txt", "-A", "physics", "-s", "COMPLETED,FAILED,TIMEOUT")
        self.seff("tables/seff-gpu-u-alice-limit1.txt", "-u", "alice", "--limit", "1")
        self.seff("tables/seff-gpu-u-alice-limit0.txt", "-u", "alice", "--limit", "0")
        month = time.strftime("%Y-%m", time.gmtime(EPOCH))
        prev = _prev_month(month)
        for m, s, e in ((prev, f"{prev}-01", f"{month}-01"), (month, f"{month}-01", "now")):
            for who in ("alice", "bob", "carol", "dave"):
                self.seff(f"tables/seff-gpu-u-{who}-month-{m}.txt", "-u", who, "-S", s, "-E", e)
            self.seff(f"tables/seff-gpu-A-physics-month-{m}.txt", "-A", "physics", "-S", s, "-E", e)
            self.seff(f"tables/seff-gpu-A-vision-month-{m}.json", "-A", "vision", "-S", s, "-E", e, "--json")
        self.seff("tables/seff-gpu-u-alice-window-hours.txt", "-u", "alice", "-S", "2026-11-18T00:00:00",
                  "-E", "2026-11-18T11:00:00")

    def reports(self) -> None:
        month = time.strftime("%Y-%m", time.gmtime(EPOCH))
        prev = _prev_month(month)
        self.gpueff("reports/cards-dry-run.txt", "report", "cards", "--dry-run")
        self.gpueff("reports/cards-dry-run-again.txt", "report", "cards", "--dry-run")
        self.gpueff(f"reports/monthly-{prev}.txt", "report", "monthly", "--month", prev, "--dry-run")
        self.gpueff(f"reports/monthly-{month}.txt", "report", "monthly", "--month", month, "--dry-run")
        self.gpueff(f"reports/monthly-{prev}-physics-site.txt", "report", "monthly", "--month", prev,
                    "--account", "physics", "--site", "--dry-run")
        self.gpueff("reports/monthly-default.txt", "report", "monthly", "--dry-run")
        self.gpueff("reports/status.txt", "report", "status")
        self.gpueff("reports/optout-list-empty.txt", "report", "optout", "--list")
        self.gpueff("reports/optout-erin.txt", "report", "optout", "erin")
        self.gpueff("reports/optout-list.txt", "report", "optout", "--list")
        self.gpueff("reports/optout-undo-erin.txt", "report", "optout", "--undo", "erin")
        self.gpueff("reports/retry.txt", "report", "retry")
        root = self.work / "reports"
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = path.relative_to(root).as_posix()
            data = path.read_bytes()
            if path.suffix == ".eml":
                data = _normalise_mail(data)
            self.write(f"mail/{rel}", data)
            self.inputs.append(f"mail/{rel}\t(file written by gpueff report ... --dry-run)")

    def alerts(self) -> None:
        self.gpueff("alerts/run-dry-run.txt", "alerts", "run", "--dry-run")
        self.gpueff("alerts/run-dry-run-again.txt", "alerts", "run", "--dry-run")
        self.gpueff("alerts/log.txt", "alerts", "log")
        self.gpueff("alerts/log.json", "alerts", "log", "--json")
        self.gpueff("alerts/log-job-5101.txt", "alerts", "log", "--job", "5101", "--limit", "5")

    def admin(self) -> None:
        self.gpueff("admin/config-check.txt", "config", "check")
        self.gpueff("admin/config-check.json", "config", "check", "--json")
        for role in ("all", "service", "node", "login"):
            self.gpueff(f"admin/doctor-{role}.txt", "doctor", "--role", role)
            self.gpueff(f"admin/doctor-{role}.json", "doctor", "--role", role, "--json")
        self.gpueff("admin/db-current.txt", "db", "current")
        self.gpueff("admin/db-check.txt", "db", "check")
        self.gpueff("admin/version.txt", "version")
        self.run("admin/version-no-config.txt", ["gpueff", "version"])
        self.gpueff("admin/ingest-empty.txt", "ingest")
        self.gpueff("admin/enrich-no-sacct.txt", "enrich")
        self.gpueff("admin/backfill-no-sacct.txt", "backfill", "--since", "2026-11-01")
        self.gpueff("admin/hook-install.txt", "hook", "install", str(self.work / "hooks-installed"))
        self.gpueff("admin/hook-install-again.txt", "hook", "install", str(self.work / "hooks-installed"))
        self.gpueff("admin/forward-once.txt", "forward", "--once", timeout=60)

    def helps(self) -> None:
        self.run("help/seff-gpu.txt", ["seff-gpu", "--help"])
        self.run("help/gpueff.txt", ["gpueff", "--help"])
        for cmd in ("agent", "live", "hook", "ingest", "db", "serve", "forward", "rollup", "demo", "config",
                    "doctor", "version", "alerts", "enrich", "backfill", "report"):
            self.run(f"help/gpueff-{cmd}.txt", ["gpueff", cmd, "--help"])
        for cmd, sub in (("config", "check"), ("alerts", "run"), ("alerts", "log"), ("report", "cards"),
                         ("report", "monthly"), ("report", "retry"), ("report", "optout"), ("report", "status")):
            self.run(f"help/gpueff-{cmd}-{sub}.txt", ["gpueff", cmd, sub, "--help"])
        for script in ("gpueff-prolog", "gpueff-epilog"):
            self.run(f"help/{script}.txt", [script, "--help"], env=self.env() | {"GPUEFF_CONFIG": "/nonexistent"})

    def errors(self) -> None:
        s = self.seff
        s("errors/seff-no-args.txt")
        s("errors/seff-bad-id.txt", "abc")
        s("errors/seff-fullwidth-id.txt", "\uff17\uff10\uff10\uff13")
        s("errors/seff-negative-id.txt", "-5")
        s("errors/seff-unknown-job.txt", "999999")
        s("errors/seff-unknown-array-task.txt", "5016_9")
        s("errors/seff-bad-option.txt", "--bogus", "4201")
        s("errors/seff-id-and-user.txt", "4201", "-u", "alice")
        s("errors/seff-html-no-id.txt", "--html", str(self.work / "x.html"), "-u", "alice")
        s("errors/seff-start-after-end.txt", "-u", "alice", "-S", "2026-11-10", "-E", "2026-11-01")
        s("errors/seff-bad-time.txt", "-u", "alice", "-S", "yesterdayish")
        s("errors/seff-bad-state.txt", "-u", "alice", "-s", "NOPE")
        s("errors/seff-bad-limit.txt", "-u", "alice", "--limit", "-1")
        s("errors/seff-running-no-figures.txt", "5101")
        self.run("errors/seff-missing-config.txt", ["seff-gpu", "--config", str(self.work / "nope.toml"), "4201"])
        g = self.gpueff
        g("errors/gpueff-no-command.txt")
        g("errors/gpueff-unknown-command.txt", "frobnicate")
        g("errors/gpueff-unknown-option.txt", "report", "cards", "--bogus")
        g("errors/gpueff-ingest-workers.txt", "ingest", "--workers", "4")
        g("errors/gpueff-demo-keep.txt", "demo", "--keep", "--dir", str(self.work / "demo2"))
        g("errors/gpueff-monthly-bad-month.txt", "report", "monthly", "--month", "2026-13", "--dry-run")
        g("errors/gpueff-monthly-site-alone.txt", "report", "monthly", "--site", "--dry-run")
        g("errors/gpueff-optout-undo-alone.txt", "report", "optout", "--undo")
        g("errors/gpueff-cards-limit-0.txt", "report", "cards", "--limit", "0", "--dry-run")
        g("errors/gpueff-db-bad-action.txt", "db", "nonsense")
        g("errors/gpueff-alerts-log-bad-limit.txt", "alerts", "log", "--limit", "x")
        g("errors/gpueff-agent-bad-interval.txt", "agent", "--energy-interval", "-1")
        g("errors/gpueff-hook-install-no-dir.txt", "hook", "install")
        base = self.config.read_text()
        for case, (section, line) in BAD_CONFIGS.items():
            path = self.work / f"bad-{case}.toml"
            if not section:
                text = line
            elif f"[{section}]\n" in base:
                text = base.replace(f"[{section}]\n", f"[{section}]\n{line}\n", 1)
            else:
                text = f"{base}\n[{section}]\n{line}\n"
            path.write_text(text)
            self.run(f"errors/config-{case}.txt", ["gpueff", "--config", str(path), "config", "check"])
            self.run(f"errors/config-{case}-seff.txt", ["seff-gpu", "--config", str(path), "4201"])
        full = self.work / "bad-full-removed.toml"
        full.write_text(self.config.read_text() + "\n[simulated]\ngpus_per_node = 8\n")
        self.run("errors/config-full-duplicate-section.txt", ["gpueff", "--config", str(full), "config", "check"])

    def metrics(self) -> None:
        """``gpueff serve`` on a copy of the database and a free port; /metrics scraped once it answers."""
        serve_db = self.work / "serve.db"
        shutil.copy(self.work / "gpueff.db", serve_db)
        cfg = self.work / "serve.toml"
        port = _free_port()
        cfg.write_text(CONFIG.format(work=self.work / "serve-run", db=serve_db, port=port, extra=""))
        shutil.copytree(self.work / "slurmbin", self.work / "serve-run" / "slurmbin")
        (self.work / "serve-run" / "spool").mkdir(parents=True)
        (self.work / "serve-run" / "reports").mkdir(parents=True)
        log = (self.work / "serve.log").open("wb")
        env = self.env() | {"GPUEFF_CONFIG": str(cfg)}
        proc = subprocess.Popen([str(self.bin / "gpueff"), "--config", str(cfg), "serve"], env=env, cwd=self.work,
                                stdout=log, stderr=subprocess.STDOUT)
        body = ""
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                        body = resp.read().decode()
                    if "gpueff_" in body:
                        break
                except OSError:
                    pass
                time.sleep(0.3)
            # The scheduler's first passes at start-up (the database check, ingest): scraped once both have
            # succeeded, not after a fixed wait (under load the ingest pass came after it, a false difference).
            ran = ('task="database_check"', 'task="ingest"')
            deadline = time.monotonic() + 60
            while True:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    body = resp.read().decode()
                done = [ln for ln in body.splitlines() if ln.startswith("gpueff_task_last_success")]
                if all(any(t in ln for ln in done) for t in ran) or time.monotonic() > deadline:
                    break
                time.sleep(0.3)
        except OSError as exc:
            body += f"(snapshot: could not scrape /metrics: {exc})\n"
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
        lines = [ln for ln in body.splitlines() if not re.match(r"(# (HELP|TYPE) )?(process_|python_gc_)", ln)]
        self.write("metrics/service.txt", "\n".join(lines) + "\n")
        self.inputs.append("metrics/service.txt\tgpueff --config <WORK>/serve.toml serve; GET /metrics")
        self.write("metrics/serve-exit.txt", f"exit {proc.returncode}\n")

    def render(self) -> None:
        self.build_input()
        self.cards()
        self.tables()
        self.reports()
        self.alerts()
        self.dump_db("inputs/db-after-reports.txt")
        self.admin()
        self.helps()
        self.errors()
        self.metrics()
        self.write("inputs.txt", f"# clock {EPOCH} (pinned); cwd <WORK>; config <WORK>/gpueff.toml\n"
                   + "\n".join(self.inputs) + "\n")


def _must(result: tuple[int, str, str]) -> None:
    """An input step that failed: no render (its outputs would compare an input that is not there)."""
    if result[0] != 0:
        raise SystemExit(f"snapshot: an input step failed (exit {result[0]}): {result[2][-2000:]}")


def _slurm_env(job_id: int, user: str, account: str, gpus: int, now: float, profile: str) -> dict[str, str]:
    gpu_list = ",".join(str(i) for i in range(gpus))
    return {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_USER": user, "SLURM_JOB_UID": str(3000 + job_id % 100),
            "SLURM_JOB_ACCOUNT": account, "SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": CLUSTER,
            "SLURMD_NODENAME": "gpu-node04", "SLURM_NODELIST": "gpu-node04", "SLURM_JOB_NUM_NODES": "1",
            "SLURM_JOB_GPUS": gpu_list, "CUDA_VISIBLE_DEVICES": gpu_list, "SLURM_SCRIPT_CONTEXT": "prolog_slurmd",
            "GPUEFF_SIM_NOW": f"{now:.3f}", "GPUEFF_SIM_PROFILE": profile}


def _normalise_mail(data: bytes) -> bytes:
    """A message with what is random per run made fixed: its Message-ID, its MIME boundaries and its images'
    Content-IDs (numbered in order of first appearance; a Content-ID also where quoted-printable wrapped it)."""
    text = data.decode("utf-8", "surrogateescape")
    text = re.sub(r"(?mi)^(Message-ID:\s*)<[^>\n]*>", r"\1<normalised@snapshot>", text)
    for n, b in enumerate(dict.fromkeys(re.findall(r'boundary="([^"]+)"', text))):
        text = text.replace(b, f"==snapshot-boundary-{n}==")
    for n, token in enumerate(dict.fromkeys(re.findall(r"(?mi)^Content-ID:\s*<[^.>]*\.([0-9a-f]{16})@", text))):
        fixed = f"{n:016d}"
        pattern = "".join(re.escape(c) + r"(=\r?\n)?" for c in token[:-1]) + re.escape(token[-1])
        text = re.sub(pattern, lambda m, f=fixed: "".join(  # type: ignore[misc]
            f[i] + (m.group(i + 1) or "") for i in range(len(f) - 1)) + f[-1], text)
    return text.encode("utf-8", "surrogateescape")


def _short(v: object) -> object:
    if isinstance(v, bytes | str) and len(v) > 300:
        return f"<{len(v)} {'bytes' if isinstance(v, bytes) else 'chars'} sha256 " \
               f"{hashlib.sha256(v if isinstance(v, bytes) else v.encode()).hexdigest()[:16]}>"
    return v


def _tag(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)


def _quote(a: str) -> str:
    return a if re.fullmatch(r"[\w@%+=:,./-]+", a) else repr(a)


def _prev_month(month: str) -> str:
    y, m = (int(x) for x in month.split("-"))
    return f"{y - 1}-12" if m == 1 else f"{y}-{m - 1:02d}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build_clock(parent: Path) -> Path:
    src = HERE / "snapclock.c"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:12]
    so = parent / f"snapclock-{digest}.so"
    if not so.exists():
        tmp = parent / f".snapclock-{os.getpid()}.so"
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-w", "-o", str(tmp), str(src), "-ldl"], check=True)
        tmp.replace(so)
    return so


def make_venv(tree: Path, venv: Path, python: str) -> None:
    """``venv`` with TREE's dependencies (made once) and TREE itself (reinstalled, not editable, every time)."""
    if not (venv / "bin" / "python").exists():
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", str(tree)], check=True)
    else:
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--force-reinstall",
                        "--no-cache-dir", str(tree)], check=True)


def render(tree: Path, out: Path, python: str = sys.executable) -> float:
    """Render ``tree`` into ``out`` (which must not exist); returns the seconds it took."""
    t0 = time.monotonic()
    tree, out = tree.resolve(), out.resolve()
    if out.exists():
        raise SystemExit(f"snapshot: {out} exists; give a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    venv = out.parent / f"venv-{out.name}"
    work = out.parent / f"work-{out.name}"
    shutil.rmtree(work, ignore_errors=True)
    (work / "home").mkdir(parents=True)
    build = Path(tempfile.mkdtemp(prefix="snapshot-build-"))
    try:  # build from a clean copy: a checkout's build/ or egg-info must not leak into the install
        subprocess.run(["git", "-C", str(tree), "archive", "--format=tar", "-o", str(build / "t.tar"), "HEAD"],
                       check=True)
        (build / "src").mkdir()
        subprocess.run(["tar", "-xf", str(build / "t.tar"), "-C", str(build / "src")], check=True)
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout
        if dirty:  # uncommitted changes to tracked files: render what is in the working tree
            subprocess.run(["rsync", "-a", "--exclude", ".git", "--exclude", ".venv", "--exclude", "*.egg-info",
                            "--exclude", "build", f"{tree}/", str(build / "src")], check=True)
        make_venv(build / "src", venv, python)
    finally:
        shutil.rmtree(build, ignore_errors=True)
    out.mkdir()
    r = Renderer(tree=tree, out=out, venv=venv, work=work, clock=build_clock(out.parent), port=9817)
    r.render()
    took = time.monotonic() - t0
    n = sum(1 for p in out.rglob("*") if p.is_file())
    print(f"snapshot: {tree} -> {out}: {n} files in {took:.0f} s")
    return took


def diff(a: Path, b: Path, cap: int = DIFF_CAP) -> int:
    """Print the files only in ``a``, only in ``b`` and those that differ (a capped unified diff of each);
    the number of differences."""
    fa = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    fb = {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    only_a, only_b = sorted(fa - fb), sorted(fb - fa)
    differ = [n for n in sorted(fa & fb) if (a / n).read_bytes() != (b / n).read_bytes()]
    print(f"# {a} vs {b}: {len(fa)} and {len(fb)} files; only in A {len(only_a)}, only in B {len(only_b)}, "
          f"differing {len(differ)}, identical {len(fa & fb) - len(differ)}")
    for n in only_a:
        print(f"only in A: {n}")
    for n in only_b:
        print(f"only in B: {n}")
    for n in differ:
        print(f"differs: {n}")
    for n in differ:
        la = (a / n).read_bytes().decode("utf-8", "backslashreplace").splitlines(keepends=True)
        lb = (b / n).read_bytes().decode("utf-8", "backslashreplace").splitlines(keepends=True)
        lines = list(difflib.unified_diff(la, lb, f"A/{n}", f"B/{n}", n=2))
        print(f"\n=== {n}")
        sys.stdout.writelines(ln if ln.endswith("\n") else ln + "\n" for ln in lines[:cap])
        if len(lines) > cap:
            print(f"... ({len(lines) - cap} more diff lines)")
    return len(only_a) + len(only_b) + len(differ)


def both(rev_a: str, rev_b: str, out: Path, repo: Path, python: str) -> int:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    trees = []
    try:
        for rev in (rev_a, rev_b):
            sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", rev], capture_output=True,
                                 text=True, check=True).stdout.strip()
            tree = Path(tempfile.mkdtemp(prefix=f"snapshot-{sha}-"))
            tree.rmdir()
            subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", str(tree), rev], check=True,
                           capture_output=True)
            trees.append((sha, tree))
        renders = []
        for sha, tree in trees:
            dest = out / sha
            render(tree, dest, python)
            renders.append(dest)
        report = out / "diff.txt"
        with report.open("w") as fh:
            saved, sys.stdout = sys.stdout, fh
            try:
                n = diff(renders[0], renders[1])
            finally:
                sys.stdout = saved
        print(f"snapshot: {n} differences; {report}")
        return 1 if n else 0
    finally:
        for _, tree in trees:
            subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(tree)], check=False)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_input"]:  # run by a tree's venv python: the input, made by that tree's code
        make_input(argv[1], argv[2])
        return 0
    p = argparse.ArgumentParser(prog="snapshot.py", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render", help="render a checkout's outputs into OUT")
    r.add_argument("tree", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--python", default=sys.executable, help="the Python that makes the venv (default: this one)")
    d = sub.add_parser("diff", help="compare two renders")
    d.add_argument("a", type=Path)
    d.add_argument("b", type=Path)
    d.add_argument("--cap", type=int, default=DIFF_CAP, help="diff lines shown per file")
    b = sub.add_parser("both", help="render two revisions (temporary worktrees) and diff them")
    b.add_argument("rev_a")
    b.add_argument("rev_b")
    b.add_argument("out", type=Path)
    b.add_argument("--repo", type=Path, default=HERE.parent)
    b.add_argument("--python", default=sys.executable)
    args = p.parse_args(argv)
    if args.cmd == "render":
        render(args.tree, args.out, args.python)
        return 0
    if args.cmd == "diff":
        return 1 if diff(args.a, args.b, args.cap) else 0
    return both(args.rev_a, args.rev_b, args.out, args.repo, args.python)


if __name__ == "__main__":
    sys.exit(main())
