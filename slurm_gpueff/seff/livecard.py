"""The node agent's answer to ``seff-gpu JOBID`` on the job's own node: its card up to the second.

Runs inside the agent: node/live_socket.py serves it, handed :func:`answerer` by ``gpueff agent``
(cli/node_cmds.py), which joins the agent and this engine. For a job running here: the same privacy rules as
every path (access/privacy.py; the asker's uid comes from the kernel), a reading taken now, the job's live
record (live.py) made into the rows ingest would store (storage/merge.py), and the same analysis and
renderers as any card. A job not running on this node answers "not here" (exit 3), and seff-gpu then asks
the database or the service as usual.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .. import jobstate, live, statedir
from ..access.privacy import denied_message, may_see, user_name, viewer
from ..analysis import assess, job_figures
from ..errors import GpueffError
from ..node import tickwire
from ..readmodel import GpuRow, JobRow, Points, gpu_row, job_row
from ..render import dumps, render_card
from ..slurm.jobid import parse
from .query import EXIT_DENIED, EXIT_OK, EXIT_UNKNOWN, Answer, failure

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..config import Config

def answerer(config: Config) -> Callable[[dict[str, Any], int], dict[str, Any]]:
    return lambda req, uid: live_answer(config, req, uid)


def live_answer(config: Config, req: dict[str, Any], uid: int) -> dict[str, Any]:
    try:
        spec = parse(str(req.get("job")))
    except GpueffError as exc:
        return failure(str(exc), exc.exit_code).to_json()
    # "job unknown": the client falls back to its usual path
    not_here = failure(f"job {spec} is not running on this node", EXIT_UNKNOWN).to_json()
    if spec.one_part:
        return not_here  # the node knows raw ids only
    saved, _problem = jobstate.load(statedir.job(config.paths.state_dir, spec.job))
    if saved is None or not isinstance(saved.get("job"), dict):
        return not_here  # not running here, or a state that names no owner
    ident = saved["job"]
    who = viewer(config, uid, user_name(uid))
    owner = SimpleNamespace(uid=ident.get("uid"), user=ident.get("user"), account=ident.get("account"))
    if not may_see(who, owner):  # before any reading: a refused user costs the agent nothing
        return failure(denied_message(str(spec), who), EXIT_DENIED).to_json()
    tickwire.request_reading(config.paths.state_dir, float(config.collector.tick_wait_s))
    rec = live.live_record(config, saved, time.time())
    if rec is None:
        return not_here
    job, gpus, tl = rows_of(rec)
    fig = job_figures(job, gpus, config.sacct.accounting)
    diag = assess(fig, config.analysis)
    out = (dumps([(job, fig, diag)], [[(job, fig)]], [tl]) if req.get("json") is True
           else render_card(job, fig, diag, (), tl))
    as_of = job.end_time.isoformat() if job.end_time else None
    return Answer(EXIT_OK, out + "\n", running=True, as_of=as_of).to_json()


def rows_of(rec: dict[str, Any]) -> tuple[JobRow, list[GpuRow], dict[tuple[str, int], Points]]:
    """The job and GPU rows ingest would make of a live record (by its own merge, unsaved), and the GPUs'
    timelines."""
    from ..storage.merge import job_key, merge  # no models: the agent has no database

    plan = merge([rec], {}, {}, datetime.now(UTC).replace(tzinfo=None))
    key = job_key(rec)
    rows = list(plan.gpus[key].values())
    tl = {(r["node"], r["gpu_index"]): g.get("timeline") or [] for r, g in zip(rows, rec["gpus"], strict=True)}
    return job_row(plan.jobs[key]), [gpu_row(r) for r in rows], {k: v for k, v in tl.items() if v}
