"""``gpueff demo``: the whole product on a simulated cluster, with no GPU and no Slurm.

Every simulated workload profile becomes a job that goes through the *real* Prolog and Epilog
(subprocesses, with a slurmd-like environment: no PATH, no HOME), the real spool, the real ingest
into a SQLite file, and the real ``seff-gpu`` card. The figures are simulated and labelled so.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import time
from typing import Any

from ..config import Config, load
from ..errors import GpueffError
from .common import UsageError

MARKER = ".gpueff-demo"

# (profile, user, account, gpus, hours, exit code): one job per profile; first job id is 4201.
JOBS: list[tuple[str, str, str, int, float, int]] = [
    ("bf16-healthy", "alice", "vision", 2, 6.0, 0),
    ("idle", "bob", "genomics", 1, 3.5, 0),
    ("one-sm-spin", "carol", "physics", 1, 2.0, 0),
    ("tiny-kernels", "bob", "genomics", 1, 4.0, 0),
    ("starved", "alice", "vision", 1, 5.0, 0),
    ("fp32-no-tensor", "dave", "physics", 1, 3.0, 0),
    ("memory-bound", "carol", "physics", 1, 2.5, 0),
    ("oversized", "erin", "chemistry", 1, 8.0, 0),
    ("one-of-n-gpus", "dave", "physics", 4, 4.0, 3),
]
FIRST_JOB_ID = 4201
UIDS = {"alice": 2001, "bob": 2002, "carol": 2003, "dave": 2004, "erin": 2005}

CONFIG = """# Written by `gpueff demo`: a simulated cluster in one folder.
[site]
cluster = "demo"

[paths]
spool_dir = {spool}
state_dir = {state}
database = {database}

[collector]
backend = "simulated"   # fake GPUs: every figure is labelled "simulated"

[simulated]
model = "Simulated H100 80GB"

[privacy]
enabled = false         # the demo's jobs belong to made-up users; show them to whoever runs the demo

[reports]
dir = {reports}         # the monthly summary the demo writes (a dry run: nothing is mailed)
admins = ["hpc-admins@example.org"]
coordinators_as_leads = false  # the simulated cluster has no sacctmgr to name its accounts' coordinators
"""


def hook_command(kind: str) -> list[str]:
    """The real hook executable: ``hooks/<kind>`` of a checkout, else the installed console script."""
    checkout = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "hooks", kind)
    if os.path.isfile(checkout):
        return [sys.executable, checkout]
    for script in (os.path.join(os.path.dirname(sys.executable), f"gpueff-{kind}"), shutil.which(f"gpueff-{kind}")):
        if script and os.path.isfile(script):
            return [script]
    raise FileNotFoundError(f"cannot find the {kind} hook (hooks/{kind} or gpueff-{kind})")


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's escapes are TOML's, plus DEL, which TOML also forbids raw."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def prepare(root: str) -> str:
    """Create (or recreate) the demo folder; refuse to wipe a folder the demo did not make. Any problem with
    the folder is a UsageError naming it (exit 2): a file in the way, no permission, a path the database URL
    cannot hold.

    A folder "made by the demo" is a real directory (no symbolic link is followed, to it or in it) owned by
    whoever runs the demo, holding the demo's marker file, also theirs: run by root in a shared /tmp, another
    user's folder dressed up as the demo's is refused rather than wiped, or written through. Its files are
    written by :mod:`outfile` (never through a link)."""
    from .. import outfile

    if any(c in root for c in "?#%") or "://" in root:
        raise UsageError(f"demo folder {root!r}: its path may not contain ?, #, % or :// (the database URL names "
                         "a file in it); choose another --dir")
    if os.path.islink(root):
        raise UsageError(f"demo folder {root} is a symbolic link: not followed; choose another --dir")
    if os.path.lexists(root) and not os.path.isdir(root):
        raise UsageError(f"demo folder {root} exists and is not a directory; choose another --dir")
    try:
        if os.path.lexists(os.path.join(root, MARKER)):
            marker = os.lstat(os.path.join(root, MARKER))
            if not (_ours(root) and stat.S_ISREG(marker.st_mode) and marker.st_uid == os.geteuid()):
                raise UsageError(f"{root} was not made by the demo run as you (its owner or its marker file "
                                 f"{MARKER} is another user's, or a link); choose another --dir")
            shutil.rmtree(root)
        elif os.path.exists(root) and os.listdir(root):
            raise UsageError(f"{root} exists and was not made by the demo; choose another --dir")
        os.makedirs(root, mode=0o700, exist_ok=True)
        if not _ours(root):  # an empty folder of someone else's, or one put in its place meanwhile
            raise UsageError(f"demo folder {root} is not yours (or is a link); choose another --dir")
        os.chmod(root, 0o700)  # its database holds (simulated) users' jobs: private, as doctor expects
        outfile.write(os.path.join(root, MARKER), b"made by gpueff demo; safe to delete\n")
        path = os.path.join(root, "gpueff.toml")
        outfile.write(path, CONFIG.format(spool=toml_string(f"{root}/spool"), state=toml_string(f"{root}/run"),
                                          database=toml_string(f"sqlite:///{root}/gpueff.db"),
                                          reports=toml_string(f"{root}/reports")).encode("utf-8"))
    except OSError as exc:  # a file where a folder must be, no permission, a read-only file system ...
        where = f" ({exc.filename})" if exc.filename and exc.filename != root else ""
        raise UsageError(f"cannot make the demo folder {root}{where}: {exc.strerror or exc}; choose another "
                         "--dir") from None
    except outfile.OutputError as exc:
        raise UsageError(f"cannot make the demo folder {root}: {exc}; choose another --dir") from None
    except UnicodeEncodeError:
        raise UsageError(f"demo folder {root!r}: its name is not valid UTF-8; choose another --dir") from None
    return path


def _ours(path: str) -> bool:
    """Whether ``path`` itself (not a link's target) is owned by whoever runs the demo."""
    return os.lstat(path).st_uid == os.geteuid()


def slurm_env(config_path: str, job_id: int, user: str, account: str, gpus: int, now: float,
              profile: str, exit_code: int | None) -> dict[str, str]:
    """What slurmd gives a Prolog/Epilog (slurm_gpueff.slurm.hookenv), plus the demo's clock and profile."""
    node = "gpu-node01" if job_id % 2 else "gpu-node02"
    gpu_list = ",".join(str(i) for i in range(gpus))
    env = {"SLURM_JOB_ID": str(job_id), "SLURM_JOB_USER": user, "SLURM_JOB_UID": str(UIDS[user]),
           "SLURM_JOB_ACCOUNT": account, "SLURM_JOB_PARTITION": "gpu", "SLURM_CLUSTER_NAME": "demo",
           "SLURMD_NODENAME": node, "SLURM_NODELIST": node, "SLURM_JOB_NUM_NODES": "1",
           "SLURM_JOB_GPUS": gpu_list, "CUDA_VISIBLE_DEVICES": gpu_list,
           "SLURM_SCRIPT_CONTEXT": "prolog_slurmd" if exit_code is None else "epilog_slurmd",
           "GPUEFF_CONFIG": config_path, "GPUEFF_SIM_NOW": f"{now:.3f}", "GPUEFF_SIM_PROFILE": profile}
    if exit_code is not None:
        env["SLURM_JOB_EXIT_CODE2"] = f"{exit_code}:0"
        env["SLURM_JOB_EXIT_CODE"] = str(exit_code << 8)
    return env


def run_jobs(config_path: str, root: str) -> list[tuple[int, str]]:
    """Run every demo job through the real Prolog and Epilog; return (job id, profile) of each."""
    ran = []
    end = time.time() - 600.0
    for n, (profile, user, account, gpus, hours, code) in enumerate(JOBS):
        job_id = FIRST_JOB_ID + n
        start = end - hours * 3600.0
        for kind, clock, exit_code in (("prolog", start, None), ("epilog", end, code)):
            env = slurm_env(config_path, job_id, user, account, gpus, clock, profile, exit_code)
            try:
                proc = subprocess.run(hook_command(kind), env=env, cwd=root, capture_output=True, text=True,
                                      timeout=60)
            except (OSError, subprocess.SubprocessError) as exc:
                raise GpueffError(f"demo: cannot run the {kind} for job {job_id}: {exc}") from None
            if proc.returncode != 0:  # hooks always exit 0; anything else is a bug worth showing
                last = (proc.stderr.strip().splitlines() or ["no message"])[-1]
                raise GpueffError(f"demo: the {kind} for job {job_id} exited {proc.returncode}: {last}")
        ran.append((job_id, profile))
        end -= 1800.0 * (n % 3 + 1)
    return ran


class SimulatedAccounting:
    """The simulated cluster's ``sacct``: each demo job's final state as Slurm would report it (COMPLETED,
    or FAILED with the simulated exit code), read by the real enrichment, as a real cluster's would be."""

    batch_size = 500

    def jobs(self, ids: list[int], cluster: str | None = None, runs: bool = False) -> list[Any]:
        from ..slurm.sacct import SacctJob

        codes = {FIRST_JOB_ID + n: job[5] for n, job in enumerate(JOBS)}
        return [SacctJob(job_id=i, job_id_text=str(i), cluster=cluster, state="FAILED" if codes[i] else "COMPLETED",
                         exit_code=codes[i], signal=0, run=0, source="simulated") for i in ids if i in codes]


def summary(config: Config, job_ids: list[int]) -> str:
    """One line per demo job with its primary verdict and the site's total waste (the demo's punchline)."""
    from ..analysis.diagnose import assess
    from ..analysis.figures import job_figures
    from ..fmt import gpu_hours, pct
    from ..render.text import SIM_BANNER, render_table
    from ..seff.lookup import lookup
    from ..slurm.jobid import JobSpec

    items = []
    for job_id in job_ids:
        for job, gpus in lookup(config, JobSpec(job_id), None):  # as seff-gpu reads them
            fig = job_figures(job, gpus, config.sacct.accounting)
            items.append((job, fig, assess(fig, config.analysis)))
    hours = sum(f.hours or 0.0 for _, f, _ in items)
    active = sum(f.waste.sm_active_h or 0.0 for _, f, _ in items)
    return "\n".join([f"Summary (all demo jobs; {SIM_BANNER.strip('* ')}):", render_table(items), "",
                      f"{gpu_hours(hours)} GPU-hours allocated, {gpu_hours(active)} of them SM-active "
                      f"({pct(active / hours)}); {gpu_hours(hours - active)} GPU-hours idle or underfilled."])


def monthly(config: Config) -> str:
    """The site's monthly summary of the demo's own jobs, written as a dry run (what the admins would get
    by mail on the 1st): its text part, and where the message lies."""
    from datetime import UTC, datetime

    from ..reports.runner import send_monthly
    from .common import database

    month = datetime.now(UTC).strftime("%Y-%m")
    with database(config) as engine:
        send_monthly(config, engine, month=month, site=True, dry_run=True)
    folder = os.path.join(config.reports.dir, "dry-run", "monthly", month, "site")
    try:
        with open(os.path.join(folder, "summary.txt"), encoding="utf-8") as fh:
            text = fh.read()
    except OSError:
        return f"(no monthly summary written under {folder})\n"
    return (f"The monthly summary the admins would get by mail ({month}, dry run; the message: "
            f"{os.path.join(folder, 'message.eml')}):\n\n{text}\n")


def run(args: Any) -> int:
    from ..service.summarize import summarize_pending
    from ..storage.enrich import enrich_jobs
    from ..storage.ingest import ingest_spool
    from . import seff
    from .common import database

    root = os.path.abspath(args.dir or "gpueff-demo")
    config_path = prepare(root)
    print(f"slurm-gpueff demo: simulated cluster 'demo' in {root}")
    print(f"  running {len(JOBS)} simulated jobs through the real Prolog/Epilog hooks ...")
    ran = run_jobs(config_path, root)
    config = load(config_path)
    with database(config) as engine:
        result = ingest_spool(engine, config.paths.spool_dir)
        enrich_jobs(engine, SimulatedAccounting())
        summarize_pending(engine, config.analysis)
    print(f"  ingested {result.ingested} spool records into {config.paths.database}"
          f" (quarantined {result.quarantined}, failed {result.failed})")
    for job_id, profile in ran:
        print(f"\n$ seff-gpu {job_id}        # simulated profile: {profile}")
        seff.main(["--config", config_path, str(job_id)])
    print(f"\n{summary(config, [job_id for job_id, _ in ran])}\n")
    print(monthly(config))
    print(f"Where the files are:\n  config    {config_path}\n  database  {config.paths.database}\n"
          f"  spool     {config.paths.spool_dir}  (empty after ingest; bad records go to quarantine/)")
    print(f"Try:  {shlex.join([*seff_command(), '--config', config_path, '--json', str(FIRST_JOB_ID)])}")
    return 0


def seff_command() -> list[str]:
    """seff-gpu by absolute path: the README's install leaves ``.venv/bin`` off PATH, so a bare name would fail."""
    script = os.path.join(os.path.dirname(os.path.abspath(sys.executable)), "seff-gpu")
    return [script] if os.access(script, os.X_OK) else [os.path.abspath(sys.executable), "-m", "slurm_gpueff.cli.seff"]
