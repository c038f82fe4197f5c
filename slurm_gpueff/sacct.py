"""Read what Slurm accounting knows about jobs: ``sacct --json``, falling back to ``sacct -P``.

The hooks see no array or het ids, job name or QOS and a provisional exit status: accounting completes
the job rows (docs/DESIGN.md, "Enrich"). Only reads, into :class:`SacctJob`; ``storage.enrich`` writes.

Facts this parser relies on (Slurm 22.05, checked on a real cluster; fixtures in tests/data/sacct/):

* ``--json`` (openapi/dbv0.0.38) gives ``tres.allocated`` entries ``{"type": "gres", "name": "gpu",
  "count": 2}`` and typed ones ``{"name": "gpu:h100"}``; ``array.job_id`` / ``het.job_id`` are 0 when
  unset; times are epoch seconds, 0 when unknown; there is no uid.
* ``--json`` in 22.05 reports ``exit_code`` ``{"status": "SUCCESS", "return_code": 0}`` even for a job
  that exited 3 (``-P`` says ``3:0``). With that plugin the exit codes are taken from a second, small
  ``-P`` query (:data:`BROKEN_JSON_EXIT_PLUGINS`).
* ``-P`` has no ArrayJobID/HetJobID fields in 22.05: array and het ids come from ``JobID``
  (``6_1``, ``7+1``) next to ``JobIDRaw``. JobName may contain the delimiter, so it is the last field.
* State text may carry a suffix (``CANCELLED by 0``); only the first word is the state.
* GPU count comes from AllocTRES (what the job held), never ReqTRES (what it asked for): a job
  cancelled while pending has an empty AllocTRES.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .config import Config
from .errors import GpueffError
from .slurmenv import parse_exit_text

# The job fields asked of ``sacct -P``; JobName last because it may contain the delimiter.
PARSABLE_FIELDS = ("JobIDRaw", "JobID", "Cluster", "User", "UID", "Account", "Partition", "QOS", "NodeList",
                   "AllocTRES", "Submit", "Start", "End", "ElapsedRaw", "State", "ExitCode", "JobName")
# sacct --json plugins whose exit_code is wrong (always SUCCESS/0): Slurm 22.05.
BROKEN_JSON_EXIT_PLUGINS = ("openapi/dbv0.0.38", "openapi/dbv0.0.37", "openapi/dbv0.0.36")
# States of a job that has not finished: its accounting record will still change.
ACTIVE_STATES = frozenset({"PENDING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING", "COMPLETING",
                           "CONFIGURING", "REQUEUE_FED", "REQUEUE_HOLD", "RESV_DEL_HOLD", "SPECIAL_EXIT",
                           "STAGE_OUT", "SIGNALING", "STOPPED"})
FINAL_STATE_CODES = "BF,CA,CD,DL,F,NF,OOM,PR,TO"  # sacct -s codes of every final state
_NONE_TEXT = {"", "None", "Unknown", "None assigned", "(null)"}


class SacctError(GpueffError):
    """sacct is missing, failed or did not answer in time: nothing was changed, try again later."""


@dataclass
class SacctJob:
    """One job allocation as Slurm accounting reports it. Times are epoch seconds (None = unknown)."""

    job_id: int                      # JobIDRaw: the key the hooks record
    job_id_text: str                 # as users see it: "6_1", "7+1", "12"
    cluster: str | None = None
    array_job_id: int | None = None
    array_task_id: int | None = None
    het_job_id: int | None = None
    het_job_offset: int | None = None
    user: str | None = None
    uid: int | None = None
    account: str | None = None
    partition: str | None = None
    qos: str | None = None
    job_name: str | None = None
    nodelist: str | None = None      # Slurm's compressed host list ("gpu[01-02]"), see expand_hostlist
    gpu_count: int = 0
    gpu_type: str | None = None
    submit: float | None = None
    start: float | None = None
    end: float | None = None
    elapsed_s: float | None = None
    state: str | None = None         # first word of sacct's state ("CANCELLED by 0" -> "CANCELLED")
    state_text: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    alloc_tres: str | None = None
    restarts: int | None = None      # this run's restart count (JSON restart_cnt, -P Restarts): its run index
    sluid: str | None = None         # 26.05+: the run's Slurm-unique id, new on each requeue
    source: str = "json"             # "json" or "parsable": which sacct output it came from
    notes: list[str] = field(default_factory=list)

    @property
    def final(self) -> bool:
        return self.state is not None and self.state not in ACTIVE_STATES

    @property
    def nodes(self) -> list[str]:
        return expand_hostlist(self.nodelist)


def state_word(text: str | None) -> str | None:
    if not text:
        return None
    return text.split()[0].upper() or None


def parse_tres(text: str | None) -> tuple[int, str | None]:
    """(GPU count, GPU type) from a TRES string like ``cpu=2,gres/gpu:h100=2,gres/gpu=2,node=1``.

    The untyped ``gres/gpu=N`` is the total; typed entries name the types (several joined by ``,``).
    Only typed entries (no total) happen when AccountingStorageTRES lists just typed GPUs: then sum.
    """
    total: int | None = None
    typed: dict[str, int] = {}
    for part in (text or "").split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or not key.startswith("gres/gpu"):
            continue
        count = _int(value)  # memory-like TRES carry a unit suffix: not GPUs, not digits, ignored
        if count is None:
            continue
        if key == "gres/gpu":
            total = count
        elif key.startswith("gres/gpu:"):
            typed[key[len("gres/gpu:"):]] = count
    if total is None:
        total = sum(typed.values())
    types = [t for t, n in typed.items() if n > 0]
    return total, (",".join(sorted(types)) if types else None)


def expand_hostlist(text: str | None) -> list[str]:
    """``"gpu[01-03,07],login1"`` -> ``["gpu01", "gpu02", "gpu03", "gpu07", "login1"]`` (Slurm's syntax).

    Only the bracket forms Slurm prints for node lists (one bracket group per name, ranges keep their
    zero padding). ``None assigned`` and empty text give an empty list.
    """
    if not text or text.strip() in _NONE_TEXT:
        return []
    out: list[str] = []
    for name in _split_top(text.strip()):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", name)
        if not m:
            out.append(name)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, sep, hi = r.partition("-")
            if sep and lo.isdigit() and hi.isdigit():
                width = len(lo)
                out.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(int(lo), int(hi) + 1))
            else:
                out.append(f"{prefix}{r}{suffix}")
    return out


def _split_top(text: str) -> list[str]:
    """Split on the commas outside brackets (a comma inside one has a ``]`` ahead before any ``[``)."""
    return [p for p in re.split(r",(?![^\[]*\])", text) if p]


def _ids_from_text(job: SacctJob) -> None:
    """Array / het ids from the display JobID (``6_1``, ``7+1``): all ``-P`` offers in 22.05."""
    m = re.fullmatch(r"(\d+)_(\d+)", job.job_id_text)
    if m:
        job.array_job_id, job.array_task_id = int(m.group(1)), int(m.group(2))
    m = re.fullmatch(r"(\d+)\+(\d+)", job.job_id_text)
    if m:
        job.het_job_id, job.het_job_offset = int(m.group(1)), int(m.group(2))


def _epoch(value: object) -> float | None:
    """sacct times: epoch numbers (json; -P with SLURM_TIME_FORMAT=%s); 0 / Unknown / None -> None."""
    v = value if isinstance(value, float) else _int(value)
    return float(v) if v is not None and v > 0 else None


def _text(value: object) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return None if text in _NONE_TEXT else text


def _int(value: object) -> int | None:
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if text.isdigit() else None


def parse_json(text: str) -> tuple[list[SacctJob], dict[str, Any]]:
    """Jobs and the ``meta`` block from ``sacct --json`` output. Steps are ignored (-X semantics)."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SacctError(f"sacct --json printed something that is not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("jobs"), list):
        raise SacctError("sacct --json output has no 'jobs' list")
    # "Nothing found with query" (9003) is how 22.05 says "no jobs": not an error
    errors = [e for e in doc.get("errors") or [] if e and not (isinstance(e, dict) and e.get("error_number") == 9003)]
    if errors and not doc["jobs"]:
        raise SacctError(f"sacct --json reported errors: {errors}")
    meta = _obj(doc.get("meta"))
    out = []
    for j in doc["jobs"]:
        if not isinstance(j, dict) or _int(j.get("job_id")) is None:
            continue
        out.append(_job_from_json(j))
    return out, meta


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _job_from_json(j: dict[str, Any]) -> SacctJob:
    arr, het, assoc, times = (_obj(j.get(k)) for k in ("array", "het", "association", "time"))
    state = j.get("state")
    state_text = state.get("current") if isinstance(state, dict) else state
    if isinstance(state_text, list):  # later data_parser versions: a list of flags
        state_text = state_text[0] if state_text else None
    job = SacctJob(job_id=int(j["job_id"]), job_id_text=str(j["job_id"]), source="json")
    array_job, task = _int(arr.get("job_id")), _int(arr.get("task_id"))
    if array_job and task is not None:
        job.array_job_id, job.array_task_id = array_job, task
        job.job_id_text = f"{array_job}_{task}"
    het_job, offset = _int(het.get("job_id")), _int(het.get("job_offset"))
    if het_job and offset is not None:
        job.het_job_id, job.het_job_offset = het_job, offset
        job.job_id_text = f"{het_job}+{offset}"
    job.cluster = _text(j.get("cluster")) or _text(assoc.get("cluster"))
    job.user = _text(j.get("user")) or _text(assoc.get("user"))
    job.account = _text(j.get("account")) or _text(assoc.get("account"))
    job.partition = _text(j.get("partition"))
    job.qos = _text(j.get("qos"))
    job.job_name = j.get("name") if isinstance(j.get("name"), str) else None
    job.nodelist = _text(j.get("nodes"))
    alloc = _obj(j.get("tres")).get("allocated")
    parts = []
    for t in alloc or []:
        if isinstance(t, dict) and t.get("type") and _int(t.get("count")) is not None:
            name = f"{t['type']}/{t['name']}" if t.get("name") else str(t["type"])
            parts.append(f"{name}={int(t['count'])}")
    job.alloc_tres = ",".join(parts)
    job.gpu_count, job.gpu_type = parse_tres(job.alloc_tres)
    job.submit, job.start, job.end = (_epoch(times.get("submission")), _epoch(times.get("start")),
                                      _epoch(times.get("end")))
    elapsed = times.get("elapsed")
    job.elapsed_s = float(elapsed) if isinstance(elapsed, int | float) and not isinstance(elapsed, bool) else None
    job.state_text = str(state_text) if state_text else None
    job.state = state_word(job.state_text)
    restarts = j.get("restart_cnt")
    job.restarts = _int(_obj(restarts).get("number") if isinstance(restarts, dict) else restarts)
    job.sluid = _text(j.get("sluid"))
    ec = _obj(j.get("exit_code"))
    code = _int(ec.get("return_code"))
    sig = _obj(ec.get("signal"))
    job.exit_code = code
    job.signal = _int(sig.get("signal_id")) if sig else (0 if code is not None else None)
    return job


def parse_parsable(text: str, delimiter: str = "|") -> list[SacctJob]:
    """Jobs from ``sacct -X -P -n --delimiter=D -o <PARSABLE_FIELDS>`` with ``SLURM_TIME_FORMAT=%s``."""
    out = []
    n = len(PARSABLE_FIELDS)
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split(delimiter)
        if len(cells) < n:
            continue  # not one of our lines (a warning sacct printed to stdout)
        cells = cells[: n - 1] + [delimiter.join(cells[n - 1:])]  # JobName may contain the delimiter
        row = dict(zip(PARSABLE_FIELDS, cells, strict=True))
        raw = _int(row["JobIDRaw"])
        if raw is None:
            continue
        job = SacctJob(job_id=raw, job_id_text=row["JobID"].strip(), source="parsable")
        _ids_from_text(job)
        job.cluster = _text(row["Cluster"])
        job.user = _text(row["User"])
        job.uid = _int(row["UID"])
        job.account = _text(row["Account"])
        job.partition = _text(row["Partition"])
        job.qos = _text(row["QOS"])
        job.job_name = row["JobName"]
        job.nodelist = _text(row["NodeList"])
        job.alloc_tres = row["AllocTRES"].strip()
        job.gpu_count, job.gpu_type = parse_tres(job.alloc_tres)
        job.submit, job.start, job.end = _epoch(row["Submit"]), _epoch(row["Start"]), _epoch(row["End"])
        elapsed = _int(row["ElapsedRaw"])
        job.elapsed_s = float(elapsed) if elapsed is not None else None
        job.state_text = _text(row["State"])
        job.state = state_word(job.state_text)
        job.exit_code, job.signal = parse_exit_text(row["ExitCode"].strip())
        out.append(job)
    return out


def parse_exit_codes(text: str, delimiter: str = "|") -> dict[int, tuple[int | None, int | None]]:
    """``{raw id: (exit, signal)}`` from ``sacct -X -P -n -o JobIDRaw,ExitCode``."""
    out = {}
    for line in text.splitlines():
        raw, sep, ec = line.partition(delimiter)
        if sep and raw.strip().isdigit():
            out[int(raw)] = parse_exit_text(ec.strip())
    return out


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
        self.timeout_s = float(timeout_s)
        self.batch_size = max(1, int(batch_size))
        self.fmt = fmt
        self.calls = 0  # sacct invocations (tests check the batching)

    @classmethod
    def from_config(cls, config: Config) -> SacctReader:
        s = config.sacct
        return cls(command=s.command, timeout_s=s.timeout_s, batch_size=s.batch_size, fmt=s.format)

    def jobs(self, job_ids: Iterable[int], cluster: str | None = None, runs: bool = False) -> list[SacctJob]:
        """Accounting records of these raw job ids (only those sacct knows; array ids expand to tasks); with
        ``runs``, every run of a requeued job (``-D``), else only its last."""
        ids = sorted({int(i) for i in job_ids})
        out: list[SacctJob] = []
        for k in range(0, len(ids), self.batch_size):
            chunk = ids[k:k + self.batch_size]
            out.extend(self._query([*(["-D"] if runs else []), "-j", ",".join(map(str, chunk))], cluster))
        return out

    def window(self, since: float, until: float, cluster: str | None = None) -> list[SacctJob]:
        """Every job of every user that *ended* between ``since`` and ``until`` (epochs).

        With ``-s`` (final states) slurmdbd selects by end time. Without it, ``-S/-E`` select by
        eligible time, and jobs whose eligible time was never recorded (seen after a slurmdbd outage:
        ``Eligible=Unknown``) are missing from the window although ``sacct -j`` shows them.
        """
        return self._query(["-a", "-s", FINAL_STATE_CODES, "-S", slurm_time(since), "-E", slurm_time(until)],
                           cluster)

    def _query(self, selection: list[str], cluster: str | None) -> list[SacctJob]:
        sel = ["-X", *selection] + (["-M", cluster] if cluster else [])
        if self.fmt in ("auto", "json"):
            try:
                jobs, meta = parse_json(self._run(["--json", *sel]))
            except SacctError as exc:
                if self.fmt == "json" or not _json_unsupported(str(exc)):
                    raise
                self.fmt = "parsable"  # this sacct has no usable --json: stop trying it
            else:
                plugin = str((meta.get("plugin") or {}).get("type") or "")
                if plugin in BROKEN_JSON_EXIT_PLUGINS and jobs:
                    codes = parse_exit_codes(self._run(["-P", "-n", f"--delimiter={self.DELIM}",
                                                        "-o", "JobIDRaw,ExitCode", *sel]), self.DELIM)
                    for j in jobs:
                        j.exit_code, j.signal = codes.get(j.job_id, (None, None))
                        j.notes.append(f"exit code from sacct -P ({plugin} reports every exit code as 0)")
                _fill_uids(jobs)  # --json has no uid
                return jobs
        fields = ",".join(PARSABLE_FIELDS)
        return parse_parsable(self._run(["-P", "-n", f"--delimiter={self.DELIM}", "-o", fields, *sel]),
                              self.DELIM)

    def _run(self, args: Sequence[str]) -> str:
        exe = self.command if os.path.isabs(self.command) else shutil.which(self.command)
        if not exe:
            raise SacctError(f"sacct not found ({self.command!r} is not on PATH): install Slurm's client "
                             "commands here or set [sacct] command; nothing was changed, run again later")
        env = dict(os.environ)
        env.pop("SLURM_TIME_FORMAT", None)
        if "-P" in args:  # epoch times in -P output; with --json it breaks sacct ("Invalid time specification")
            env["SLURM_TIME_FORMAT"] = "%s"
        self.calls += 1
        try:
            p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=self.timeout_s, env=env,
                               check=False)
        except FileNotFoundError:
            raise SacctError(f"sacct not found at {exe}: set [sacct] command; nothing was changed") from None
        except subprocess.TimeoutExpired:
            raise SacctError(f"sacct did not answer within {self.timeout_s:g} s (slurmdbd busy or down?); "
                             "nothing was changed, the next run retries") from None
        except OSError as exc:
            raise SacctError(f"cannot run sacct ({exe}): {exc}") from None
        if p.returncode != 0:
            msg = (p.stderr or p.stdout).strip().splitlines()
            raise SacctError(f"sacct failed (exit {p.returncode}): {msg[0] if msg else 'no message'}; "
                             "nothing was changed, the next run retries")
        return p.stdout


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


def no_gpus_note(spec: str, config: Config, timeout_s: float = 5.0) -> str | None:
    """For seff-gpu: a sentence if sacct knows job ``spec`` and it finished without any GPU, else None.

    CPU-only jobs get no record by design, so "not in the database" would mislead. Bounded by
    ``timeout_s``; any sacct problem just gives None (seff-gpu then says unknown)."""
    s = config.sacct
    reader = SacctReader(command=s.command, timeout_s=min(timeout_s, s.timeout_s), fmt="parsable")
    try:
        jobs = reader._query(["-j", spec], None)
    except SacctError:
        return None
    if jobs and all(j.final and not j.gpu_count for j in jobs):
        tres = jobs[0].alloc_tres or "nothing allocated"
        return f"job {spec} had no GPUs allocated (sacct AllocTRES: {tres}): nothing to report"
    return None
