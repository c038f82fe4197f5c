"""``seff-gpu JOBID``: the GPU efficiency card of a finished Slurm job, in the spirit of ``seff``.

Reads the job database (``paths.database``); never talks to the GPUs. Exit codes: :data:`EPILOG`.
An id that names more than ``MAX_CARDS`` jobs (an array with its tasks) prints a one-line-per-job
table instead of the cards; ``--json`` always carries every job.

``seff-gpu -u USER [-A ACCOUNT] [-S START] [-E END] [--json]``: one line per job, with totals. Reads only
the per-job summary columns (written at ingest by slurm_gpueff.summarize), so a month of a user's jobs is
one indexed query. Times are local (like sacct) and select jobs by their end time; defaults: the last
7 days up to now.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from ..sacct import ACTIVE_STATES
from .common import CONFIG_HELP, CONFIG_NOTE, CommandError, UsageError, database, run_command, safe_url

if TYPE_CHECKING:
    from ..config import Config
    from ..jobid import JobSpec

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_UNKNOWN = 3
EXIT_RUNNING = 4
EXIT_NO_GPUS = 5
EXIT_DENIED = 6  # another user's job, and privacy is on (slurm_gpueff.privacy)

MAX_CARDS = 10
SQUEUE_TIMEOUT_S = 5.0
TABLE_DAYS = 7  # -u/-A without -S: the jobs of the last week

DESCRIPTION = """\
Show how well a finished Slurm job used its GPUs: allocated GPU-hours, kernel
activity (what nvidia-smi calls "GPU utilization"), SM activity (the share of the
GPU's multiprocessors actually busy), tensor-core and memory-bandwidth activity,
peak GPU memory, energy, where the GPU-hours went, a verdict in plain words and
what to try. Figures that were not measured read "n/a (reason)", never 0."""

EPILOG = """\
job ids:
  123        a job (for an array or heterogeneous job: all its tasks/components)
  123_4      task 4 of array job 123
  123+1      component 1 of heterogeneous job 123

examples:
  seff-gpu 4201
  seff-gpu 4201 --json | jq '.jobs[0].waste'
  seff-gpu 777_3 --cluster hpc1
  GPUEFF_CONFIG=/path/gpueff.toml seff-gpu 4201

exit status:
  0 ok, 1 error (e.g. database unreachable), 2 bad usage or job id,
  3 job unknown, 4 job still running or pending, 5 job had no GPUs,
  6 another user's job (non-admins see only their own; [privacy] in the config)

""" + CONFIG_NOTE


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seff-gpu", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("jobid", nargs="?", help="Slurm job id: 123, 123_4 (array task) or 123+1 (het component)")
    # Many jobs: a reportseff-style table from the stored summaries (_table).
    p.add_argument("-u", "--user", help="list this user's jobs (one line each, with totals) instead of a card")
    p.add_argument("-A", "--account", help="list this account's jobs (with -u: that user's jobs in it)")
    p.add_argument("-S", "--starttime", dest="start", metavar="TIME", help="jobs that ended from TIME (local; "
                   "YYYY-MM-DD[THH:MM]; default 7 days ago)")
    p.add_argument("-E", "--endtime", dest="end", metavar="TIME", help="jobs that ended before TIME (default now)")
    p.add_argument("--json", action="store_true", help="print a machine-readable JSON document instead")
    p.add_argument("--html", metavar="FILE", help="also write the card as an HTML page (the mailed card, one "
                   "self-contained file; several jobs: FILE-<jobid>.html)")
    p.add_argument("--config", metavar="PATH", help=CONFIG_HELP)
    p.add_argument("--cluster", metavar="NAME", help="only jobs of this cluster (default: any cluster in the "
                   "database)")
    return p


def still_running(spec: JobSpec, state_dir: str, timeout: float = SQUEUE_TIMEOUT_S) -> str | None:
    """Why we think the job has not finished (None if it has or we cannot tell).

    Two signs, cheapest first: the Prolog's state file for the job on this node, then ``squeue``
    (when installed), bounded by ``timeout`` so a slow controller cannot hang the command.
    """
    plain = spec.task is None and spec.het_offset is None
    if plain and os.path.exists(os.path.join(state_dir, "jobs", f"{spec.job}.json")):
        return "it is still running on this node (its Prolog state file exists)"
    squeue = shutil.which("squeue")
    if not squeue:
        return None
    try:
        out = subprocess.run([squeue, "-h", "-j", str(spec), "-o", "%T"], capture_output=True, text=True,
                             timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    active = [s for s in out.stdout.upper().split() if s in ACTIVE_STATES]
    return f"squeue reports it {active[0]}" if out.returncode == 0 and active else None


def lookup(db: str, spec: JobSpec, cluster: str | None) -> list[tuple[Any, list[Any]]]:
    """(job, its GPU rows) for every match. Raises RuntimeError with a clear message on DB problems.

    SQLite is read with the standard library (storage/sqlite_read.py: the same rows without importing
    SQLAlchemy, which was most of seff-gpu's run time); database servers through SQLAlchemy.
    """
    from ..storage.dburl import database_url, sqlite_file

    url = database_url(db)
    path = sqlite_file(url)
    if path is not None:
        if not os.path.exists(path):
            raise RuntimeError(f"the job database {path} does not exist yet (paths.database in the config; "
                               "`gpueff ingest` creates it)")
        import sqlite3

        from ..storage.sqlite_read import lookup as read_sqlite

        try:
            return read_sqlite(path, spec, cluster)
        except sqlite3.Error as exc:
            raise RuntimeError(f"cannot read the job database {path}: {exc}") from None
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from ..storage.db import first_line, make_engine
    from ..storage.queries import find_jobs, job_gpus

    try:
        engine = make_engine(db, create=False)
    except Exception as exc:  # bad URL, missing driver
        raise RuntimeError(f"cannot open the job database {safe_url(url)}: {exc}") from None
    try:
        with Session(engine) as session:
            jobs = find_jobs(session, spec, cluster)
            return [(j, job_gpus(session, j)) for j in jobs]
    except SQLAlchemyError as exc:
        raise RuntimeError(f"cannot read the job database {safe_url(url)}: {first_line(exc)}") from None
    finally:
        engine.dispose()


def _refuse_conflicts(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A JOBID shows cards, -u/-A a table of jobs: a flag of the one mode is refused in the other."""
    table = [flag for flag, value in (("-u/--user", args.user), ("-A/--account", args.account),
                                      ("-S/--starttime", args.start), ("-E/--endtime", args.end)) if value]
    if args.jobid is None and not (args.user or args.account):
        parser.error("give a JOBID, or -u USER / -A ACCOUNT for a table of jobs")
    if args.jobid is not None and table:
        parser.error(f"{', '.join(table)} (a table of jobs) cannot be combined with a JOBID (a job's card)")
    if args.jobid is None and args.html:
        parser.error("--html writes a job's card: give a JOBID, not -u/-A")


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _refuse_conflicts(parser, args)
    return run_command("seff-gpu", _run, args)


def _run(args: argparse.Namespace) -> int:
    from ..config import load
    from ..jobid import parse

    if args.jobid is None:  # the many-jobs table
        return _table(args, load(args.config))
    return _show(args, parse(args.jobid), load(args.config))  # a bad id is refused before the config is read


def _show(args: argparse.Namespace, spec: JobSpec, config: Config) -> int:
    """Assess each job with GPUs that ``spec`` names; print their cards, a table or JSON."""
    found, skipped = _inquire(spec, config, args.cluster)
    from ..analysis import assess, job_figures

    items = []
    for job, gpus in found:
        fig = job_figures(job, gpus)
        items.append((job, fig, assess(fig, config.analysis)))
    if args.html:  # the mailed card as a file; the terminal output below is unchanged
        try:
            for path in _write_html(config, found, items, args.html):
                print(f"wrote {path}", file=sys.stderr)
        except OSError as exc:
            raise CommandError(f"cannot write {args.html}: {exc.strerror or exc}", EXIT_ERROR) from None
    from ..render import dumps, render_card, render_table

    items, runs = by_job(items)
    if args.json:
        print(dumps(items, runs))
        return EXIT_OK
    if len(items) > 1:
        print(f"{len(items)} jobs match {spec}" + (f" ({skipped} without GPUs not shown)" if skipped else ""))
        print()
    if len(items) > MAX_CARDS:
        print(render_table(items))
        print()
        print(f"For one job's card: seff-gpu {spec.job}_<task> (array) or the raw job id.")
        return EXIT_OK
    for n, ((job, fig, diag), job_runs) in enumerate(zip(items, runs, strict=True)):
        if n:
            print()
            print("-" * 80)
        print(render_card(job, fig, diag, job_runs))
    return EXIT_OK


def by_job(items: list[tuple[Any, Any, Any]]) -> tuple[list[tuple[Any, Any, Any]], list[list[tuple[Any, Any]]]]:
    """A requeued job's runs (a row each) as one item, its last run's, and each item's runs by end time."""
    from ..storage.jobmatch import run_order

    groups: dict[tuple[str, int], list[tuple[Any, Any, Any]]] = {}
    for item in items:
        groups.setdefault((item[0].cluster, item[0].job_id), []).append(item)
    for group in groups.values():
        group.sort(key=lambda it: run_order(it[0]))
    return [g[-1] for g in groups.values()], [[(j, f) for j, f, _d in g] for g in groups.values()]


def _write_html(config: Config, found: Sequence[tuple[Any, list[Any]]], items: Sequence[tuple[Any, Any, Any]],
                path: str) -> list[str]:
    """``--html``: the mailed card, with its chart as a ``data:`` URI, so the file opens in any browser with
    nothing next to it; several jobs (an array) give one file each, ``-<job id>`` before the extension.
    ``found`` = (job, GPU rows), ``items`` = (job, figures, diagnosis), in the same order."""
    from sqlmodel import Session

    from ..fmt import job_label
    from ..reports.card import build_card
    from ..storage.queries import gpu_timelines

    gpus_of = {id(job): gpus for job, gpus in found}
    cards, runs = by_job(list(items))  # a requeued job: one file, its last run's card with the Runs line
    with database(config, create=False, read_only=True) as engine, Session(engine) as session:
        timelines = [gpu_timelines(session, gpus_of[id(job)]) for job, _f, _d in cards]
    written = []
    stem, ext = os.path.splitext(path)
    for (job, fig, diag), job_runs, tl in zip(cards, runs, timelines, strict=True):
        card = build_card(job, fig, diag, [tl[g.id] for g in gpus_of[id(job)] if g.id in tl], config,
                          optout_hint=False, runs=job_runs if len(job_runs) > 1 else ())
        out = path if len(cards) == 1 else f"{stem}-{job_label(job)}{ext or '.html'}"
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(card.html())
        written.append(out)
    return written


def _inquire(spec: JobSpec, config: Config, cluster: str | None) -> tuple[list[tuple[Any, list[Any]]], int]:
    """The jobs with GPUs this user may see, and how many without GPUs were left out; else why there are none."""
    error = None
    found: list[tuple[Any, list[Any]]] = []
    try:
        found = lookup(config.paths.database, spec, cluster)
        if not found and (spec.task is not None or spec.het_offset is not None):
            found = _by_raw_id(spec, config, cluster)
    except RuntimeError as exc:
        error = str(exc)
    from ..privacy import current_user, denied_message, visible  # like sacct's PrivateData=jobs

    found, hidden = visible(found, config.privacy)
    if hidden and not found:
        raise CommandError(denied_message(str(spec), current_user()[1]), EXIT_DENIED)
    if not found:
        running = still_running(spec, config.paths.state_dir)
        if running:
            raise CommandError(f"job {spec} has not finished: {running}. Its GPU card is available after it ends.",
                         EXIT_RUNNING)
        if error:
            raise CommandError(error, EXIT_ERROR)
        from ..sacct import no_gpus_note  # CPU-only jobs have no record by design: ask accounting

        note = no_gpus_note(str(spec), config)
        if note:
            raise CommandError(note, EXIT_NO_GPUS)
        where = f" on cluster {cluster}" if cluster else ""
        raise CommandError(f"job {spec} is not in the GPU job database{where} (it had no GPUs, has not been ingested "
                     "yet, or the id is wrong)", EXIT_UNKNOWN)
    with_gpus = [(j, g) for j, g in found if g or j.gpu_count]
    if not with_gpus:
        raise CommandError(f"job {spec} had no GPUs allocated: nothing to report", EXIT_NO_GPUS)
    return with_gpus, len(found) - len(with_gpus)


def _by_raw_id(spec: JobSpec, config: Config, cluster: str | None) -> list[tuple[Any, list[Any]]]:
    """``123_4`` / ``123+1`` right after the job ended, before enrichment: the hooks recorded only the raw
    id (the nodes see no array or het ids), so ask sacct for it (one call, bounded) and look that up. The
    rows found lack the array/het ids sacct just gave: they are filled in for this display only (the
    enrichment writes them). Any sacct problem just finds nothing (the caller then says why)."""
    from ..jobid import JobSpec
    from ..slurmcmds import RESOLVE_TIMEOUT_S, SlurmCommandError, raw_id

    try:
        raw = raw_id(str(spec), config.sacct.command, cluster, min(RESOLVE_TIMEOUT_S, config.sacct.timeout_s))
    except SlurmCommandError:
        return []
    found = lookup(config.paths.database, JobSpec(raw), cluster) if raw is not None else []
    for job, _gpus in found:
        if spec.task is not None and job.array_task_id is None:
            job.array_job_id, job.array_task_id = spec.job, spec.task
        if spec.het_offset is not None and job.het_job_offset is None:
            job.het_job_id, job.het_job_offset = spec.job, spec.het_offset
    return found


def parse_time(text: str) -> datetime:
    """``YYYY-MM-DD`` or ``YYYY-MM-DDTHH:MM[:SS]`` in local time -> naive UTC (how the DB stores times)."""
    try:
        local = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"bad time {text!r}: use YYYY-MM-DD or YYYY-MM-DDTHH:MM[:SS]") from None
    if local.tzinfo is None:
        local = local.astimezone()  # interpret as this host's local time
    return local.astimezone(UTC).replace(tzinfo=None)


def _table(args: argparse.Namespace, config: Config) -> int:
    from sqlalchemy.exc import SQLAlchemyError
    from sqlmodel import Session

    from ..fmt import iso, utc
    from ..models import utcnow
    from ..render.jobs_table import as_json, render
    from ..storage.db import engine_for, first_line
    from ..storage.queries import list_jobs

    end = parse_time(args.end) if args.end else utcnow()
    start = parse_time(args.start) if args.start else end - timedelta(days=TABLE_DAYS)
    if start >= end:
        raise UsageError("-S/--starttime must be before -E/--endtime")
    user = args.user
    from ..privacy import current_user, sees_everything  # like sacct: non-admins see only their own jobs

    uid, name = current_user()
    if not sees_everything(config.privacy, uid, name):
        if user is None:
            user = name
        elif user != name:
            raise CommandError(f"you may only list your own jobs (user {name}); [privacy] in the config",
                               EXIT_DENIED)
    try:
        engine = engine_for(config.paths, create=False, read_only=True)
        with Session(engine) as session:
            jobs = list_jobs(session, user=user, account=args.account, start=start, end=end, cluster=args.cluster)
        engine.dispose()
    except SQLAlchemyError as exc:
        raise CommandError(f"cannot read the job database: {first_line(exc)}", EXIT_ERROR) from None
    query = {"user": user, "account": args.account, "cluster": args.cluster,
             "start_utc": iso(start), "end_utc": iso(end)}
    if args.json:
        print(json.dumps(as_json(jobs, query), indent=2))
        return 0
    who = " ".join(f"{k} {v}" for k, v in (("user", user), ("account", args.account)) if v) or "all users"
    print(f"GPU jobs of {who} that ended {utc(start)} to {utc(end)}")
    if not jobs:
        print("(none)")
        return 0
    print(render(jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
