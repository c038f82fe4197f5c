"""Records pushed by the GPU nodes (``gpueff forward``) into the database: ``POST /v1/records``.

The push layout keeps the database's credentials on the service host alone: a node holds only its MUNGE
credential, and the service takes records from root (or a ``[service] push_users`` uid) on any host of
the cluster's MUNGE realm. The acknowledgement is the whole protocol:

- a record is acknowledged once it is committed, or once it is kept in the service's quarantine because it
  is not a valid record (with a ``.error`` saying why): either way the node deletes it and never sends it
  again;
- a record that is not acknowledged (the database is down or busy, a conflict with a concurrent writer)
  stays on the node and comes again; storing one twice changes nothing (storage/merge.py), so a reply lost
  on the way, a service killed after its commit, or a node killed before its deletes cost nothing.

Body: ``{"node": NAME, "records": [{"name": FILE NAME, "record": {...}}, ...]}``; reply:
``{"acked": [FILE NAME, ...], "stored": N, "quarantined": N, "left": N}``. Writes go one push at a time
(a lock): a multi-node job's records from several nodes at once would otherwise race to create its row.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from sqlalchemy.engine import Engine

from .. import record as recmod
from .. import spool
from ..errors import ConfigError, RecordError

log = logging.getLogger("gpueff.intake")

MAX_RECORDS = 5000  # per push; the forwarder sends fewer


class IntakeError(Exception):
    """The push is refused as a whole (nothing stored, nothing acknowledged): its HTTP status and why."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


@dataclass(frozen=True)
class Entry:
    name: str
    record: Any


def push_uids(users: Sequence[str]) -> frozenset[int]:
    """root and ``[service] push_users`` (user names or uids): whose credentials may push records."""
    uids = {0}
    for user in users:
        if user.isascii() and user.isdigit():
            uids.add(int(user))
            continue
        try:
            uids.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            raise ConfigError(f"service.push_users: no such user {user!r}") from None
    return frozenset(uids)


def parse_push(body: bytes) -> tuple[str, list[Entry]]:
    """The node's name and its entries; IntakeError 400 for a body that is not a push."""
    try:
        d = orjson.loads(body)
    except ValueError:
        raise IntakeError(400, "the body is not JSON") from None
    if not isinstance(d, dict) or not isinstance(d.get("records"), list) or not set(d) <= {"node", "records"}:
        raise IntakeError(400, 'the body must be {"node": NAME, "records": [...]}')
    node = d.get("node", "")
    if not isinstance(node, str) or len(node) > 255:
        raise IntakeError(400, "node must be a string")
    if len(d["records"]) > MAX_RECORDS:
        raise IntakeError(413, f"at most {MAX_RECORDS} records per push")
    entries, names = [], set()
    for item in d["records"]:
        if not isinstance(item, dict) or set(item) != {"name", "record"}:
            raise IntakeError(400, 'each record must be {"name": FILE NAME, "record": {...}}')
        name = item["name"]
        if not isinstance(name, str) or len(name) > 255 or not spool.RECORD_NAME.fullmatch(name) or name in names:
            raise IntakeError(400, f"record name {str(name)[:80]!r} is not a spool record's, or comes twice")
        names.add(name)
        entries.append(Entry(name, item["record"]))
    return node, entries


class Intake:
    """Validates, stores and quarantines pushed records; one push at a time."""

    def __init__(self, engine: Engine, quarantine_dir: str):
        self.engine = engine
        self.spool_dir = quarantine_dir
        self._lock = threading.Lock()

    def push(self, uid: int, body: bytes) -> tuple[dict[str, Any], str]:
        """The reply and a line for the log; IntakeError when nothing may be acknowledged."""
        from ..storage.ingest import store_records
        from ..storage.writer import UNAVAILABLE

        node, entries = parse_push(body)
        good: list[tuple[str, dict[str, Any]]] = []
        refused: list[tuple[Entry, str]] = []
        for e in entries:
            try:
                good.append((e.name, recmod.validate(e.record)))
            except RecordError as exc:
                refused.append((e, str(exc)))
        with self._lock:
            try:
                out = store_records(self.engine, good)
            except UNAVAILABLE as exc:
                from ..storage.db import first_line

                raise IntakeError(503, f"the database is unavailable ({first_line(exc)}); send again later") from None
        for err in out.errors:
            log.warning("push from %s: %s", node or f"uid {uid}", err)
        by_name = {e.name: e for e in entries}
        refused += [(by_name[name], why) for name, why in out.rejected]
        kept = [e.name for e, why in refused if self.quarantine(e, why, uid, node)]
        acked = out.stored + kept
        reply = {"acked": acked, "stored": len(out.stored), "quarantined": len(kept), "left": len(entries) - len(acked)}
        what = (f"uid {uid} node {node or '?'}: {len(entries)} records, stored {len(out.stored)}, "
                f"quarantined {len(kept)}, left {reply['left']}")
        return reply, what

    def quarantine(self, e: Entry, why: str, uid: int, node: str) -> bool:
        """Keep a refused record with its reason; False (not acknowledged, so it comes again) if it cannot."""
        error = f"{why} (pushed by uid {uid} from node {node or '?'} as {e.name})"
        try:
            dest = spool.quarantine_data(self.spool_dir, e.name, json.dumps(e.record).encode(), error)
        except (OSError, ValueError) as exc:
            log.error("cannot quarantine pushed record %s (%s): %s; it stays on its node", e.name, why, exc)
            return False
        log.warning("quarantined pushed record %s from %s: %s", os.path.basename(dest), node or f"uid {uid}", why)
        return True
