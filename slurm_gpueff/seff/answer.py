"""What ``seff-gpu`` answers, in one straight flow: a :class:`~.query.SeffQuery` and who asks (a privacy
Viewer) -> :func:`answer` -> an :class:`~.query.Answer` (exit status, stdout, stderr, HTML pages).

Both of seff-gpu's paths run this same function: its direct path in the user's own process (root, the
service account, the demo: whoever may read the database), and ``gpueff serve``'s API for everyone else
(service/api.py), where the Viewer is the uid MUNGE vouched for. The caller prints the Answer, writes the
HTML pages as files (on the client, as the calling user) and exits with its status, so both paths give
the same bytes. Nothing here prints, exits or writes a file.

Cards: every job the id names (an array: its tasks), each assessed by the analysis; more than
``MAX_CARDS`` give a one-line-per-job table; ``json`` always carries every job. Tables (``-u``/``-A``):
the per-job summary columns of the jobs that ended in [start, end).
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from .. import jobstate, statedir
from ..access.privacy import Denied, Viewer, denied_message, hides_others_jobs, may_see, shown, table_scope
from ..analysis import Diagnosis, JobFigures, assess, job_figures
from ..errors import GpueffError, JobIdError, SlurmCommandError
from ..fmt import iso, job_label, utc
from ..readmodel import GpuRow, JobRow
from ..render import dumps, render_card, render_table
from ..render.jobs_table import as_json, render
from ..render.text import Runs, Timelines, is_live
from ..slurm import commands
from ..slurm.commands import RESOLVE_TIMEOUT_S, job_ids
from ..slurm.jobid import parse
from ..slurm.runner import SlurmRunner
from ..slurm.sacct import cpu_only, no_gpus_note
from ..storage.jobmatch import ORDER, RawIds, run_order
from .lookup import lookup, orm_session, timelines
from .query import (
    EXIT_NO_GPUS,
    EXIT_OK,
    EXIT_RUNNING,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    Answer,
    Refused,
    SeffQuery,
    Unavailable,
    failure,
)

if TYPE_CHECKING:
    from ..config import Config
    from ..slurm.jobid import JobSpec

MAX_CARDS = 10
Found = list[tuple[JobRow, list[GpuRow]]]  # the jobs an id names, each with its GPU rows
Item = tuple[JobRow, JobFigures, Diagnosis]  # a job assessed


def answer(query: SeffQuery, config: Config, viewer: Viewer) -> Answer:
    """seff-gpu's answer to ``query`` for ``viewer``; an error is an Answer too (its line and status)."""
    try:
        if query.jobid is None:
            return _table(query, config, viewer)
        return _cards(query, parse(query.jobid), config, viewer)
    except Unavailable as exc:
        return failure(exc.told(viewer), exc.exit_code)
    except GpueffError as exc:
        return failure(str(exc), exc.exit_code)


# -- cards ------------------------------------------------------------------------------------------------

def _cards(query: SeffQuery, spec: JobSpec, config: Config, viewer: Viewer) -> Answer:
    """Assess each job with GPUs that ``spec`` names; their cards, a table or JSON."""
    found, skipped, note = _inquire(spec, config, query.cluster, viewer)
    items = []
    for job, gpus in found:
        fig = job_figures(job, gpus, config.sacct.accounting)
        items.append((job, fig, assess(fig, config.analysis)))
    cards, runs = by_job(items)
    # Timelines only for what shows them: every card, the JSON and the pages; not a long array's table.
    need = query.json or query.html or len(cards) <= MAX_CARDS
    ids = {id(job) for job, _f, _d in cards}
    tl_of = timelines(config, [(j, g) for j, g in found if id(j) in ids]) if need else {}
    tls = [tl_of.get(id(job), {}) for job, _f, _d in cards]
    pages = _html(config, found, cards, runs, tls) if query.html else []
    running = any(is_live(job) for job, _f, _d in cards)
    as_of = max((job.end_time for job, _f, _d in cards if is_live(job) and job.end_time), default=None)
    as_of_text = as_of.isoformat() if as_of else None
    if query.json:
        return Answer(EXIT_OK, dumps(cards, runs, tls, config.sacct.accounting) + "\n", html=pages, running=running,
                      as_of=as_of_text, stderr=f"{note}\n" if note else "")
    out: list[str] = [*textwrap.wrap(note, 80, break_on_hyphens=False), ""] if note else []
    if len(cards) > 1:
        out += [f"{len(cards)} jobs match {spec}" + (f" ({skipped} without GPUs not shown)" if skipped else ""), ""]
    if len(cards) > MAX_CARDS:
        out += [render_table(cards), "", f"For one job's card: seff-gpu {spec.job}_<task> (array) or the raw job id."]
        return Answer(EXIT_OK, "\n".join(out) + "\n", html=pages)
    for n, ((job, fig, diag), job_runs, tl) in enumerate(zip(cards, runs, tls, strict=True)):
        if n:
            out += ["", "-" * 80]
        out.append(render_card(job, fig, diag, job_runs, tl, config.sacct.accounting))
    return Answer(EXIT_OK, "\n".join(out) + "\n", html=pages, running=running, as_of=as_of_text)


def by_job(items: list[Item]) -> tuple[list[Item], list[list[tuple[JobRow, JobFigures]]]]:
    """A requeued job's runs (a row each) as one item, its last run's, and each item's runs by end time."""
    groups: dict[tuple[str, int], list[Item]] = {}
    for item in items:
        groups.setdefault((item[0].cluster, item[0].job_id), []).append(item)
    for group in groups.values():
        group.sort(key=lambda it: run_order(it[0]))
    return [g[-1] for g in groups.values()], [[(j, f) for j, f, _d in g] for g in groups.values()]


def _html(config: Config, found: Found, cards: Sequence[Item], runs: Sequence[Runs],
          tls: Sequence[Timelines]) -> list[tuple[str, str]]:
    """``--html``: the mailed card, its chart a ``data:`` URI, so a page opens with nothing next to it; a
    requeued job gives one page (its last run's card with the Runs line). ``found`` = (job, GPU rows);
    ``cards``, ``runs``, ``tls`` as :func:`by_job` and :func:`timelines` give them, in the same order."""
    from ..reports.card import build_card  # Jinja2 and the tables' models: for --html only

    gpus_of = {id(job): gpus for job, gpus in found}
    pages = []
    for (job, fig, diag), job_runs, tl in zip(cards, runs, tls, strict=True):
        points = [tl[(g.node, g.gpu_index)] for g in gpus_of[id(job)] if (g.node, g.gpu_index) in tl]
        card = build_card(job, fig, diag, points, config, optout_hint=False,
                          runs=job_runs if len(job_runs) > 1 else ())
        pages.append((job_label(job), card.html()))
    return pages


def still_running(spec: JobSpec, config: Config, timeout: float | None = None,
                  viewer: Viewer | None = None) -> str | None:
    """Why we think the job has not finished (None if it has or we cannot tell).

    Two signs, cheapest first: the Prolog's state file for the job on this node, then ``squeue``
    (when installed), bounded by ``timeout`` so a slow controller cannot hang the command. A job ``viewer``
    may not see is refused as another user's (:func:`not_yours`), or, where Slurm hides other users' jobs,
    None: as for a job that does not run.
    """
    plain = spec.task is None and spec.het_offset is None
    if plain and jobstate.exists(config.paths.state_dir, spec.job):
        if viewer is not None and not _may_see_running(config, spec, viewer):
            not_yours(spec, config, viewer)  # as the finished job's card would answer
            return None
        return "it is still running on this node (its Prolog state file exists)"
    job = commands.active_job(SlurmRunner.from_config(config), str(spec),
                              commands.SQUEUE_TIMEOUT_S if timeout is None else timeout)
    if job is None:
        return None
    if viewer is not None and not _may_see_owner(viewer, job.uid, job.user, job.account):
        not_yours(spec, config, viewer)
        return None
    return f"squeue reports it {job.state}"


def not_yours(spec: JobSpec, config: Config, viewer: Viewer) -> None:
    """``spec`` names a job that ``viewer`` may not see: Denied (exit 6, "belongs to another user"), unless
    Slurm's PrivateData hides other users' jobs (access/privacy.py, :func:`hides_others_jobs`): then this
    returns, and the caller goes on as for a job that does not exist, to give exactly that answer (the same
    status and line, whatever else it asks on the way)."""
    if not hides_others_jobs(config):
        raise Denied(denied_message(str(spec), viewer))


def _may_see_running(config: Config, spec: JobSpec, viewer: Viewer) -> bool:
    """Whether ``viewer`` may see job ``spec``, running on this node, by the owner its Prolog saved; a state
    that names no owner (unreadable, or written without one) is shown to those who see every job."""
    saved, _problem = jobstate.load(statedir.job(config.paths.state_dir, spec.job))
    ident = saved.get("job") if saved is not None else None
    if not isinstance(ident, dict):
        return viewer.all
    return _may_see_owner(viewer, ident.get("uid"), ident.get("user"), ident.get("account"))


def _may_see_owner(viewer: Viewer, uid: object, user: object, account: object) -> bool:
    """The privacy rules for a running job known only by its owner's ids; an owner nobody named is seen only
    by those who see every job."""
    if uid is None and user is None:
        return viewer.all
    return may_see(viewer, SimpleNamespace(uid=uid, user=user, account=account))


def _inquire(spec: JobSpec, config: Config, cluster: str | None,
             viewer: Viewer) -> tuple[Found, int, str | None]:
    """The jobs with GPUs ``viewer`` may see, how many without GPUs were left out, and a note on what may not
    show before accounting is read; else why there are none."""
    error: Unavailable | None = None
    note = None
    found: Found = []
    try:
        found = lookup(config, spec, cluster)
        if config.sacct.accounting and _before_accounting(spec, found):
            found, note = _from_accounting(spec, config, cluster, found)
    except Unavailable as exc:
        error = exc
    found, hidden = shown(found, viewer)  # like sacct's PrivateData=jobs, plus account leads
    if hidden and not found:
        not_yours(spec, config, viewer)  # or, hidden as Slurm hides them, on as for no such job
    if not found:
        running = still_running(spec, config, viewer=viewer)
        if running:
            raise Refused(f"job {spec} has not finished: {running}. Its GPU card is available after it ends.",
                          EXIT_RUNNING)
        if error:
            raise error
        cpu_jobs = cpu_only(str(spec), config) if config.sacct.accounting else []
        if cpu_jobs and not all(_may_see_owner(viewer, j.uid, j.user, j.account) for j in cpu_jobs):
            not_yours(spec, config, viewer)  # accounting knows another user's job: as a card would answer
        elif cpu_jobs:
            raise Refused(no_gpus_note(str(spec), cpu_jobs), EXIT_NO_GPUS)
        where = f" on cluster {cluster}" if cluster else ""
        raw_only = ("; this site keeps no Slurm accounting, so records know only raw job ids: ask for an array task "
                    "or het component by its raw id" if spec.one_part and not config.sacct.accounting else "")
        raise Refused(f"job {spec} is not in the GPU job database{where} (it had no GPUs, has not been ingested "
                      f"yet, or the id is wrong{raw_only})", EXIT_UNKNOWN)
    with_gpus = [(j, g) for j, g in found if g or j.gpu_count]
    if not with_gpus:
        reasons = sorted({r for j, _g in found if (r := j.reason)})
        why = f" ({'; '.join(reasons)})" if reasons else ""
        raise Refused(f"job {spec} had no GPUs allocated{why}: nothing to report", EXIT_NO_GPUS)
    return with_gpus, len(found) - len(with_gpus), note


def _before_accounting(spec: JobSpec, found: Found) -> bool:
    """Whether ``spec`` may name more, or other, jobs than the records show until accounting is read: a
    task or component not found (its record has only the raw id), or a plain id whose ended records were not
    enriched yet (it may be an array's id, or a het job's: the nodes never see those)."""
    if spec.one_part:
        return not found
    return not found or any(not job.enriched and not job.live for job, _gpus in found)


def _from_accounting(spec: JobSpec, config: Config, cluster: str | None,
                     found: Found) -> tuple[Found, str | None]:
    """Right after a job ended, before enrichment: ask sacct which jobs ``spec`` names (one bounded call:
    an array's tasks, a het job's components, or the one task ``123_4``), look them up by their raw ids and
    label them as accounting does, for this display only (enrichment writes the ids). sacct failing leaves
    ``found``, with a note for a plain id saying what it may not show yet."""
    try:
        ids = job_ids(SlurmRunner.from_config(config), str(spec), cluster,
                      min(RESOLVE_TIMEOUT_S, config.sacct.timeout_s))
    except SlurmCommandError as exc:
        if spec.one_part:
            return found, None
        return found, (f"Note: Slurm's accounting was not read yet ({exc}): this shows the record whose raw id is "
                       f"{spec.job}. If it is an array or a heterogeneous job, its other tasks or components show "
                       f"once `gpueff enrich` has read accounting; ask for one as {spec.job}_TASK, "
                       f"{spec.job}+OFFSET or by its raw id.")
    if spec.one_part:
        ids = {raw: text for raw, text in ids.items() if text == str(spec)}
    if not ids:
        return found, None
    have = {job.id for job, _gpus in found}
    merged = [(_labelled(job, ids), gpus) for job, gpus in
              found + [(j, g) for j, g in lookup(config, RawIds(tuple(ids)), cluster) if j.id not in have]]
    if spec.one_part:
        merged = [(j, g) for j, g in merged if j.job_id in ids]
    return sorted(merged, key=lambda jg: tuple(_none_first(getattr(jg[0], c)) for c in ORDER)), None


def _labelled(job: JobRow, ids: Mapping[int, str]) -> JobRow:
    """A job not enriched yet with the array or het ids accounting gives its raw id (for this display only)."""
    if job.job_id not in ids or job.enriched:
        return job
    try:
        named = parse(ids[job.job_id])
    except JobIdError:  # a JobID no Slurm writes: the record keeps its raw id
        return job
    if named.task is not None:
        job = replace(job, array_job_id=named.job, array_task_id=named.task)
    if named.het_offset is not None:
        job = replace(job, het_job_id=named.job, het_job_offset=named.het_offset)
    return job


def _none_first(value: Any) -> tuple[bool, Any]:
    return (value is not None, value if value is not None else 0)


# -- tables -----------------------------------------------------------------------------------------------

def table_window(start: str | None, end: str | None) -> tuple[datetime, datetime]:
    """A table's [start, end) as naive UTC, how the database stores times: ISO text without an offset is UTC
    already (seff-gpu turned the user's local time into UTC); with one (``+14:00``, ``Z``) it is turned into
    UTC here (compared as it came, an aware time against a naive one was a TypeError). Refused (exit 2) when
    either is not a time, UTC cannot hold it (``0001-01-01T00:00+14:00``), or start is not before end."""
    try:
        times = [datetime.fromisoformat(text or "") for text in (start, end)]
    except ValueError:
        raise Refused("a table needs its start and end times (ISO, UTC)", EXIT_USAGE) from None
    try:
        first, last = (t if t.tzinfo is None else t.astimezone(UTC).replace(tzinfo=None) for t in times)
    except OverflowError:
        raise Refused("a table's start or end time is out of range once turned into UTC", EXIT_USAGE) from None
    if first >= last:
        raise Refused("-S/--starttime must be before -E/--endtime", EXIT_USAGE)
    return first, last


def _table(query: SeffQuery, config: Config, viewer: Viewer) -> Answer:
    """One line per job that ended in [start, end) of the user/account the viewer may list, with totals."""
    from ..storage.summaries import list_jobs, table_totals  # SQLAlchemy: tables read the ORM everywhere

    start, end = table_window(query.start, query.end)
    user, account = table_scope(viewer, query.user, query.account)
    states = [s.strip().upper() for s in (query.state or "").split(",") if s.strip()] or None
    with orm_session(config) as session:
        jobs = list_jobs(session, user=user, account=account, start=start, end=end, cluster=query.cluster,
                         states=states, limit=query.limit or None)
        totals = table_totals(session, user=user, account=account, start=start, end=end, cluster=query.cluster,
                              states=states)
    if query.json:
        asked = {"user": user, "account": account, "cluster": query.cluster, "states": states,
                 "start_utc": iso(start), "end_utc": iso(end)}
        return Answer(EXIT_OK, json.dumps(as_json(jobs, asked, totals), indent=2) + "\n")
    who = " ".join(f"{k} {v}" for k, v in (("user", user), ("account", account)) if v) or "all users"
    if states == ["RUNNING"]:
        head = (f"Running GPU jobs of {who}: figures so far, each as of its latest reading (readings from "
                f"{utc(start)} to {utc(end)})\n")
    else:
        which = f" in state {', '.join(states)}" if states else ""
        head = f"GPU jobs of {who}{which} that ended {utc(start)} to {utc(end)} (running jobs: figures so far)\n"
    if len(jobs) < totals["rows"]:
        head += (f"The newest {len(jobs):,} of {totals['rows']:,} lines; the totals are over all of them "
                 "(--limit N for more, --limit 0 for all, --json for a program)\n")
    return Answer(EXIT_OK, head + (render(jobs, totals) if jobs else "(none)") + "\n")
