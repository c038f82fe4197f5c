"""Read what Slurm accounting knows about jobs: ``sacct --json``, falling back to ``sacct -P``.

The hooks see no array or het ids, job name or QOS and a provisional exit status: accounting completes
the job rows (docs/DESIGN.md, "Enrich"). Only reads, into :class:`SacctJob`; ``storage.enrich`` writes.
The JSON of every plugin is read by :mod:`.sacct_json`, ``-P`` text by :mod:`.sacct_rows` (both checked
on real 22.05.8, 24.11.5 and 26.05.5 output, tests/data/sacct/<version>/). This module runs sacct:

* ``--json`` first; where the plugin's exit codes are wrong (22.05's openapi/dbv0.0.38, 23.02's
  data_parser/v0.0.39) they come from a second, small ``-P`` query, matched per run by raw id and start.
* ``-D`` (``runs=True``) lists every run of a requeued job, one :class:`SacctJob` each, numbered by
  :attr:`SacctJob.run`; without it one record per raw id, its latest run.
* SLURM_TIME_FORMAT=%s only for ``-P``: with ``--json`` it breaks sacct ("Invalid time specification").
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence

from ..config import Config
from .runner import SlurmCommandError, SlurmRunner, id_chunks
from .sacct_json import EXIT_CODES_WRONG, SacctError, exit_codes_wrong, number, parse_json, plugin_name
from .sacct_rows import (
    ACTIVE_STATES,
    PARSABLE_FIELDS,
    RESTARTS_FIELDS,
    SacctJob,
    expand_hostlist,
    last_runs,
    number_runs,
    parse_exit_codes,
    parse_parsable,
    parse_tres,
    raw_id_of,
    state_word,
)
from .sacct_steps import STEP_FIELDS, attach, parse_steps

__all__ = ["ACTIVE_STATES", "EXIT_CODES_WRONG", "FINAL_STATE_CODES", "PARSABLE_FIELDS", "RESTARTS_FIELDS",
           "SacctError", "SacctJob", "SacctReader", "cpu_only", "exit_codes_wrong", "expand_hostlist", "no_gpus_note",
           "number", "parse_exit_codes", "parse_json", "parse_parsable", "parse_tres", "plugin_name",
           "raw_id_of", "slurm_time", "state_word"]

FINAL_STATE_CODES = "BF,CA,CD,DL,F,NF,OOM,PR,TO"  # sacct -s codes of every final state


def slurm_time(epoch: float) -> str:
    """An epoch as sacct's -S/-E expect it (local time, like every Slurm command line)."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(epoch))


class SacctReader:
    """Runs sacct (bounded by ``timeout_s``) in batches of ``batch_size`` job ids; ``fmt`` ``"auto"`` is json,
    falling back to parsable when this sacct has no working --json. Every failure raises :class:`SacctError`
    saying what to do; the caller keeps its rows unchanged and retries on its next run."""

    DELIM = "\x1f"  # ASCII unit separator: never in user names, accounts or job names in practice

    def __init__(self, command: str = "sacct", timeout_s: float = 60.0, batch_size: int = 500, fmt: str = "auto"):
        if fmt not in ("auto", "json", "parsable"):
            raise ValueError(f"sacct format {fmt!r}: expected auto, json or parsable")
        self.command = command
        self.slurm = SlurmRunner(command)
        self.timeout_s = float(timeout_s)
        self.batch_size = max(1, int(batch_size))
        self.fmt = fmt
        self.restarts_field = True  # False once this sacct rejected -P's Restarts (22.05)

    @classmethod
    def from_config(cls, config: Config) -> SacctReader:
        s = config.sacct
        return cls(command=s.command, timeout_s=s.timeout_s, batch_size=s.batch_size, fmt=s.format)

    def jobs(self, job_ids: Iterable[int], cluster: str | None = None, runs: bool = False) -> list[SacctJob]:
        """Accounting records of these raw job ids (only those sacct knows; array ids expand to tasks).

        ``runs``: every run of a requeued job (``sacct -D``), each with :attr:`SacctJob.run` 0, 1, ...;
        otherwise one record per raw id, its latest run."""
        ids = sorted({int(i) for i in job_ids})
        out: list[SacctJob] = []
        for piece in id_chunks(ids, self.batch_size):  # batch_size ids a call, and never an argument too long
            out.extend(self._query(["-j", piece], cluster, runs))
        return out

    def window(self, since: float, until: float, cluster: str | None = None, runs: bool = False) -> list[SacctJob]:
        """Every job of every user that *ended* between ``since`` and ``until`` (epochs); ``runs`` as in jobs().

        With ``-s`` (final states) slurmdbd selects by end time. Without it, ``-S/-E`` select by
        eligible time, and jobs whose eligible time was never recorded (seen after a slurmdbd outage:
        ``Eligible=Unknown``) are missing from the window although ``sacct -j`` shows them.
        """
        return self._query(["-a", "-s", FINAL_STATE_CODES, "-S", slurm_time(since), "-E", slurm_time(until)],
                           cluster, runs)

    def _query(self, selection: list[str], cluster: str | None, runs: bool = False) -> list[SacctJob]:
        sel = ["-X", *(["-D"] if runs else []), *selection, *(["-M", cluster] if cluster else [])]
        jobs = self._json(sel) if self.fmt in ("auto", "json") else None
        if jobs is None:
            jobs = self._parsable(sel)
        jobs = number_runs(jobs) if runs else last_runs(jobs)
        self._cpu(jobs, cluster)
        return jobs

    def _cpu(self, jobs: list[SacctJob], cluster: str | None) -> None:
        """The CPU side of the finished ones (sacct_steps.py); a sacct that cannot say leaves it unknown."""
        ids = sorted({j.job_id for j in jobs if j.run_over})
        if not ids:
            return
        try:  # one query for the jobs of one query, in pieces only where a window's jobs pass an argument's size
            text = "\n".join(self._run(["-P", "-n", f"--delimiter={self.DELIM}", "-o", ",".join(STEP_FIELDS),
                                         "-j", piece, *(["-M", cluster] if cluster else [])]).rstrip("\n")
                              for piece in id_chunks(ids))
        except SacctError as exc:
            for j in jobs:
                j.notes.append(f"CPU use unknown: {exc}")
            return
        attach(jobs, parse_steps(text, self.DELIM))

    def _json(self, sel: list[str]) -> list[SacctJob] | None:
        """Jobs from ``--json`` (exit codes from ``-P`` where the plugin's are wrong); None: no usable --json."""
        try:
            jobs, meta = parse_json(self._run(["--json", *sel]))
        except SacctError as exc:
            if self.fmt == "json" or not _json_unsupported(str(exc)):
                raise
            self.fmt = "parsable"  # this sacct has no usable --json: stop trying it
            return None
        plugin = plugin_name(meta)
        if exit_codes_wrong(plugin) and jobs:
            codes = parse_exit_codes(self._run(["-P", "-n", f"--delimiter={self.DELIM}",
                                                "-o", "JobIDRaw,Start,ExitCode", *sel]), self.DELIM)
            for j in jobs:
                j.exit_code, j.signal = codes.get((j.job_id, j.start), codes.get((j.job_id, None), (None, None)))
                j.notes.append(f"exit code from sacct -P ({plugin} reports every normal exit as 0)")
        _fill_uids(jobs)  # --json has no uid
        return jobs

    def _parsable(self, sel: list[str]) -> list[SacctJob]:
        fields = RESTARTS_FIELDS if self.restarts_field else PARSABLE_FIELDS
        try:
            text = self._run(["-P", "-n", f"--delimiter={self.DELIM}", "-o", ",".join(fields), *sel])
        except SacctError as exc:
            if not self.restarts_field or "Restarts" not in str(exc):
                raise
            self.restarts_field = False  # 22.05: 'Invalid field requested: "Restarts"'
            return self._parsable(sel)
        return parse_parsable(text, self.DELIM, fields)

    @property
    def calls(self) -> int:
        """sacct invocations so far (tests check the batching)."""
        return self.slurm.calls

    def _run(self, args: Sequence[str]) -> str:
        """sacct's stdout; a failure is a :class:`SacctError` that says what the admin can do. ``-P`` prints
        epoch times (with --json that setting breaks sacct: "Invalid time specification")."""
        try:
            return self.slurm.run("sacct", args, self.timeout_s, epoch_times="-P" in args)
        except SlurmCommandError as exc:
            raise SacctError(_advice(exc, self.command)) from None


def _advice(exc: SlurmCommandError, command: str) -> str:
    """What a failed sacct call means for the caller: nothing was changed, and what to do."""
    if exc.why == "missing" and os.path.isabs(command):
        return f"sacct not found at {command}: set [sacct] command; nothing was changed"
    if exc.why == "missing":
        return (f"sacct not found ({command!r} is not on PATH): install Slurm's client commands here or set "
                "[sacct] command; nothing was changed, run again later")
    if exc.why == "timeout":
        return (f"sacct did not answer within {exc.timeout_s:g} s (slurmdbd busy or down?); nothing was changed, "
                "the next run retries")
    if exc.why == "unrunnable":
        if isinstance(exc.oserror, FileNotFoundError):
            return f"sacct not found at {exc.exe}: set [sacct] command; nothing was changed"
        return f"cannot run sacct ({exc.exe}): {exc.oserror}"
    return (f"sacct failed (exit {exc.returncode}): {exc.first_line}; nothing was changed, the next run "
            "retries")


def _fill_uids(jobs: list[SacctJob]) -> None:
    """uid from this host's user database where sacct gave only the name (unknown users stay None)."""
    import contextlib
    import pwd

    for j in jobs:
        if j.uid is None and j.user:
            with contextlib.suppress(KeyError):
                j.uid = pwd.getpwnam(j.user).pw_uid


def _json_unsupported(message: str) -> bool:
    """The error text of a sacct without --json (older Slurm, or built without the openapi plugins)."""
    m = message.lower()
    return any(s in m for s in ("unrecognized option", "invalid option", "not json", "no 'jobs'",
                                "openapi", "data_parser", "serializer"))


def _quick_reader(config: Config, timeout_s: float) -> SacctReader:
    s = config.sacct
    reader = SacctReader(command=s.command, timeout_s=min(timeout_s, s.timeout_s), fmt="parsable")
    reader.restarts_field = False  # one call, no run numbers needed: works on 22.05 too
    return reader


def cpu_only(spec: str, config: Config, timeout_s: float = 5.0) -> list[SacctJob]:
    """For seff-gpu: the jobs sacct knows as ``spec`` if every one finished without any GPU, else none.

    CPU-only jobs get no record by design, so "not in the database" would mislead. Bounded by ``timeout_s``;
    any sacct problem just gives none (seff-gpu then says unknown). Whose they are is the caller's to check."""
    try:
        jobs = _quick_reader(config, timeout_s)._query(["-j", spec], None)
    except SacctError:
        return []
    if jobs and all(j.final and not j.gpu_count and not j.shards for j in jobs):  # shards are of GPUs
        return jobs
    return []


def no_gpus_note(spec: str, jobs: Sequence[SacctJob]) -> str:
    """The sentence seff-gpu answers for the CPU-only ``jobs`` of :func:`cpu_only`."""
    tres = jobs[0].alloc_tres or "nothing allocated"
    return f"job {spec} had no GPUs allocated (sacct AllocTRES: {tres}): nothing to report"
    if jobs and all(j.final and not j.gpu_count and not j.shards for j in jobs):  # shards are of GPUs
        tres = jobs[0].alloc_tres or "nothing allocated"
        return f"job {spec} had no GPUs allocated (sacct AllocTRES: {tres}): nothing to report"
    return None
