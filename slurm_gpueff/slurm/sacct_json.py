"""Read ``sacct --json`` of every plugin, from 22.05's ``openapi/dbv0.0.38`` to 26.05's ``data_parser/v0.0.45``.

What differs between them (real captures of 22.05.8, 24.11.5 and 26.05.5 in tests/data/sacct/<version>/):

* integers: plain in 22.05 (``"task_id": 3``, ``null`` when unset); data_parser v0.0.39+ wrap most of
  them as ``{"set": bool, "infinite": bool, "number": n}`` (:func:`number` reads both);
* the signal: ``signal.signal_id`` (22.05, v0.0.39) or ``signal.id``, wrapped (v0.0.40+); a signalled
  job has ``return_code`` unset (v0.0.40+) or -127 (v0.0.39);
* the state: a string (22.05) or a list of flags (``["PENDING", "REQUEUED"]`` for a requeued run);
* the plugin name: ``meta.plugin.type`` (22.05), ``meta.plugins.data_parser`` (23.02),
  ``meta.plugin.data_parser`` (23.11 on);
* ``restart_cnt`` from v0.0.42, ``sluid`` (new per run) from v0.0.45.

Exit codes are wrong in some plugins (:data:`EXIT_CODES_WRONG`): the reader then asks ``-P`` for them.
"""

from __future__ import annotations

import json
from typing import Any

from ..errors import SlurmCommandError
from .sacct_rows import SacctJob, epoch, parse_shards, parse_tres, state_word, text_or_none, to_int

# Plugins (last part of the name) whose exit_code says SUCCESS / 0 for every normal exit, 3 included:
# 22.05's openapi/dbv0.0.3x (seen in the 22.05.8 capture) and 23.02's data_parser/v0.0.39 (its
# DUMP_FUNC(JOB_EXIT_CODE) sets return_code 0 whenever WIFEXITED, in every 23.02 and 23.11 release).
EXIT_CODES_WRONG = frozenset({"dbv0.0.36", "dbv0.0.37", "dbv0.0.38", "v0.0.39"})
# Flags that sacct prints instead of the base state, in the order Slurm's job_state_string() checks them.
_STATE_FLAGS = ("COMPLETING", "STAGE_OUT", "CONFIGURING", "RESIZING", "REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD",
                "SPECIAL_EXIT", "STOPPED", "REVOKED", "RESV_DEL_HOLD", "SIGNALING")


class SacctError(SlurmCommandError):
    """sacct is missing, failed, did not answer in time or printed what cannot be read: nothing was changed,
    try again later."""


def number(value: object) -> int | None:
    """An integer as any plugin writes it: plain, or ``{"set", "infinite", "number"}``.

    Unset and infinite both give None: no field read here has a meaningful infinity (time limits are
    not read), and a 0 in their place would be invented."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        value = value.get("number")
    return to_int(value)


def plugin_name(meta: dict[str, Any]) -> str | None:
    """The plugin that wrote the JSON, e.g. ``openapi/dbv0.0.38`` or ``data_parser/v0.0.42``."""
    for key in ("plugin", "plugins"):
        plugin = _obj(meta.get(key))
        for name in ("data_parser", "type"):
            text = text_or_none(plugin.get(name))
            if text:
                return text
    return None


def exit_codes_wrong(plugin: str | None) -> bool:
    """True for the plugins whose exit codes must come from ``sacct -P`` instead."""
    return bool(plugin) and str(plugin).rsplit("/", 1)[-1] in EXIT_CODES_WRONG


def json_state(current: object) -> str | None:
    """sacct's state word from ``state.current``: a string (22.05) or a list of flags, read like sacct
    -P does (``["PENDING", "REQUEUED"]`` is the REQUEUED run of a requeued job, not a pending one)."""
    if isinstance(current, list):
        names = [str(s) for s in current if s]
        return next((f for f in _STATE_FLAGS if f in names), names[0] if names else None)
    return text_or_none(current)


def json_exit(ec: dict[str, Any]) -> tuple[int | None, int | None]:
    """(exit code, signal) from ``exit_code``; (None, None) when the job has none yet.

    A signalled job gets exit code 0, as sacct -P and the Epilog say it (``0:11``): a wait status that
    ended by a signal has no exit byte, and the JSON leaves return_code unset or -127 there."""
    sig = _obj(ec.get("signal"))
    signo = number(sig.get("id", sig.get("signal_id")))
    code = number(ec.get("return_code"))
    code = code if code is not None and code >= 0 else None
    if signo:
        return (code or 0), signo
    return (code, 0) if code is not None else (None, None)


def parse_json(text: str) -> tuple[list[SacctJob], dict[str, Any]]:
    """Jobs and the ``meta`` block from ``sacct --json`` output. Steps are ignored (-X semantics).

    Every record is returned; with 22.05 that includes a requeued job's earlier runs (see last_runs)."""
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
    plugin = plugin_name(meta)
    out = []
    for j in doc["jobs"]:
        if isinstance(j, dict) and number(j.get("job_id")) is not None:
            out.append(_job_from_json(j, plugin))
    return out, meta


def _obj(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _job_from_json(j: dict[str, Any], plugin: str | None) -> SacctJob:
    arr, het, assoc, times = (_obj(j.get(k)) for k in ("array", "het", "association", "time"))
    job_id = number(j["job_id"]) or 0
    job = SacctJob(job_id=job_id, job_id_text=str(job_id), source="json", plugin=plugin)
    array_job, task = number(arr.get("job_id")), number(arr.get("task_id"))
    if array_job and task is not None:
        job.array_job_id, job.array_task_id = array_job, task
        job.job_id_text = f"{array_job}_{task}"
    job.array_throttle = number(_obj(_obj(_obj(arr.get("limits")).get("max")).get("running")).get("tasks")) or None
    het_job, offset = number(het.get("job_id")), number(het.get("job_offset"))
    if het_job and offset is not None:
        job.het_job_id, job.het_job_offset = het_job, offset
        job.job_id_text = f"{het_job}+{offset}"
    job.cluster = text_or_none(j.get("cluster")) or text_or_none(assoc.get("cluster"))
    job.user = text_or_none(j.get("user")) or text_or_none(assoc.get("user"))
    job.account = text_or_none(j.get("account")) or text_or_none(assoc.get("account"))
    job.partition = text_or_none(j.get("partition"))
    job.qos = text_or_none(j.get("qos"))
    job.job_name = j.get("name") if isinstance(j.get("name"), str) else None
    job.nodelist = text_or_none(j.get("nodes"))
    parts = []
    for t in _obj(j.get("tres")).get("allocated") or []:
        count = number(t.get("count")) if isinstance(t, dict) else None
        if count is not None and count >= 0 and t.get("type"):  # energy=-2 (unknown) in array tasks: -P omits it
            parts.append(f"{t['type']}/{t['name']}={count}" if t.get("name") else f"{t['type']}={count}")
    job.alloc_tres = ",".join(sorted(parts))  # sorted by name, as sacct -P prints AllocTRES
    job.gpu_count, job.gpu_type = parse_tres(job.alloc_tres)
    job.shards = parse_shards(job.alloc_tres)
    job.submit, job.start, job.end = (epoch(number(times.get(k))) for k in ("submission", "start", "end"))
    elapsed = number(times.get("elapsed"))
    job.elapsed_s = float(elapsed) if elapsed is not None else None
    job.state = state_word(json_state(_obj(j.get("state")).get("current") if isinstance(j.get("state"), dict)
                                      else j.get("state")))
    job.state_text = job.state
    if job.state == "CANCELLED":
        job.cancelled_by = text_or_none(j.get("kill_request_user"))
    job.exit_code, job.signal = json_exit(_obj(j.get("exit_code")))
    job.restart_count = number(j.get("restart_cnt"))
    job.sluid = text_or_none(j.get("sluid"))
    return job
