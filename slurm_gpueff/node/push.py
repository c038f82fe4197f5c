"""``gpueff forward``: push this node's spooled records to ``gpueff serve`` (``POST /v1/records``).

The node holds no database credentials: each push is signed with the node's MUNGE credential (made by
root, bound to the body's digest, good for one request; access/client.py), and the service stores the
records and acknowledges them by name (service/intake.py). A file is deleted only after its record was
acknowledged, and only if it was not replaced meanwhile (a running job's live record is rewritten in
place), so:

- service down, network cut, database down: nothing is acknowledged, the files stay, the next pass sends
  them again; passes back off (doubling up to ``service.forward_max_backoff_s``); a service that answers
  "busy" (storing other nodes' pushes) says when to come back, and the node does;
- the forwarder or the node killed at any point, even between the acknowledgement and the deletes: the
  records come again, and storing a record twice changes nothing on the service;
- a file that is not a trusted record (a link, another owner's, not JSON, larger than the service takes)
  is quarantined here, in the node's spool, with the reason, like ingest does; a record the service finds
  invalid is quarantined there and acknowledged, so no node sends it for ever.

Records go oldest first, a job's records together (spool.pending_by_job), at most ``batch`` records and
``[service] push_max_mb`` per push.

Records that the Epilog could not write into the spool (full, read-only) wait in a fallback spool
(spool.py): each pass first moves them back into the spool if it takes them again, else sends them from
where they are, before the spool's own (they are older), and deletes them on the same acknowledgement. A
fallback record whose name is also in the spool is the older copy: it goes to its fallback's quarantine,
as the Epilog's drain does, and is not sent (a push names each record once).

Each pass (and each push within it) rewrites a heartbeat, ``<state_dir>/forward.json``: when it ran, its
outcome, and by when the next pass is due, so that ``gpueff doctor --role node`` can tell a forwarder that
stopped from one that waits.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from .. import spool, statedir
from ..access.client import RECORDS_PATH, Reply, Unreachable, api_url, post_signed
from ..access.spool_trust import SpoolTrust, configured_trust, read_json, spool_trust
from ..config import Config
from ..errors import ConfigError, RecordError

log = logging.getLogger("gpueff.forward")

BATCH = 500  # records per push: a few hundred kB for typical records
MAX_RETRY_AFTER_S = 3600.0  # the longest a "busy" service may send a node away (its turn after a long herd)
_ENVELOPE = 256  # bytes of the body around its records, and per record around its JSON


@dataclass
class PassResult:
    """One pass over the spool: ``ok`` when nothing that could be sent was left behind."""

    acked: int = 0
    quarantined_here: int = 0
    left: int = 0
    from_fallback: int = 0  # of ``acked``: sent from a fallback spool
    moved_back: int = 0  # fallback records moved back into the spool
    ok: bool = True
    errors: list[str] = field(default_factory=list)
    retry_after_s: float | None = None  # the service was busy and said when to come back


@dataclass
class _Item:
    path: str
    data: bytes  # the record's JSON
    ident: tuple[int, int]  # (inode, mtime ns) when read: a file replaced since is not deleted
    fallback: bool = False  # from a fallback spool


class Forwarder:
    """This node's spool, the service's address, and what a pass needs between passes."""

    def __init__(self, config: Config, batch: int = BATCH):
        if not api_url(config.service):
            raise ConfigError("gpueff forward pushes records to gpueff serve: set [service] api_url to the service's "
                              "address (e.g. http://gpueff.example.org:9820), as on login nodes")
        self.config = config
        self.spool_dir = config.paths.spool_dir
        self.trust = configured_trust(config)
        self.batch = max(1, batch)
        self.max_bytes = int(config.service.push_max_mb * 1024 * 1024)
        self.node = socket.gethostname().split(".")[0]
        self.heartbeat = Heartbeat(config)
        self.fallback_trust: dict[str, SpoolTrust] = {}  # fallback spool (normalised) -> whose files it takes

    def run_pass(self) -> PassResult:
        """Send everything waiting in the fallback spools and the spool, in pushes; stop at the first push
        that is not answered."""
        res = PassResult()
        res.moved_back = spool.drain_fallbacks(self.config, os.environ, _spool_log)
        paths = [p for group in spool.pending_by_job(self.spool_dir, stale_tmp_s=spool.STALE_TMP_S) for p in group]
        stranded = self._stranded({os.path.basename(p) for p in paths}, res)
        fallback = len(stranded)
        paths = stranded + paths
        items: list[_Item] = []
        size = _ENVELOPE
        for n, path in enumerate(paths):
            item = self._read(path, res, n < fallback)
            if item is None:
                continue
            if items and (len(items) >= self.batch or size + len(item.data) + _ENVELOPE > self.max_bytes):
                if not self._send(items, res):
                    res.left += len(paths) - n  # this one and those after it, for the next pass
                    return res
                items, size = [], _ENVELOPE
            items.append(item)
            size += len(item.data) + _ENVELOPE
        if items:
            self._send(items, res)
        return res

    def _stranded(self, in_spool: set[str], res: PassResult) -> list[str]:
        """The records waiting in fallback spools (those the drain could not move back), oldest first; one
        whose name is in the spool, or in another fallback before it, is quarantined where it is instead."""
        out: list[str] = []
        seen = set(in_spool)
        for d in spool.fallback_dirs(self.config, os.environ):
            if not spool.private_dir(d, create=False):
                continue
            self.fallback_trust.setdefault(os.path.normpath(d), spool_trust(d, str(os.geteuid()),
                                                                            self.config.spool.max_file_mb))
            for group in spool.pending_by_job(d, stale_tmp_s=spool.STALE_TMP_S):
                for path in group:
                    name = os.path.basename(path)
                    if name in seen:
                        self._quarantine(path, f"stranded in fallback spool {d}; a newer record for the same job "
                                               "and node was already in the spool", res)
                        continue
                    seen.add(name)
                    out.append(path)
        return out

    def _read(self, path: str, res: PassResult, fallback: bool = False) -> _Item | None:
        trust = self.fallback_trust.get(os.path.normpath(_spool_of(path)), self.trust) if fallback else self.trust
        try:
            st = os.lstat(path)
            rec = read_json(path, trust)
            data = orjson.dumps(rec)
        except FileNotFoundError:
            return None  # gone meanwhile (another forwarder, a newer live record renamed over it)
        except RecordError as exc:
            self._quarantine(path, str(exc), res)
            return None
        except TypeError as exc:  # orjson cannot write it (an integer beyond 64 bits): not a record
            self._quarantine(path, f"not a record: {exc}", res)
            return None
        except OSError as exc:  # unreadable right now: not the record's fault
            res.left += 1
            res.errors.append(f"{path}: cannot read: {exc}")
            return None
        if len(data) + 2 * _ENVELOPE > self.max_bytes:
            self._quarantine(path, f"{len(data)} bytes, more than the service takes in one push "
                                   f"([service] push_max_mb = {self.config.service.push_max_mb:g})", res)
            return None
        return _Item(path, data, (st.st_ino, st.st_mtime_ns), fallback)

    def _send(self, items: list[_Item], res: PassResult) -> bool:
        """One push; the acknowledged files deleted. False if the service did not take it (retry later)."""
        names = [orjson.dumps(os.path.basename(i.path)) for i in items]
        body = b"".join([b'{"node":', orjson.dumps(self.node), b',"records":[',
                         b",".join(b'{"name":' + n + b',"record":' + i.data + b"}" for n, i in zip(names, items,
                                                                                                   strict=True)),
                         b"]}"])
        try:
            reply = post_signed(self.config.service, RECORDS_PATH, body)
        except Unreachable as exc:
            return self._failed(items, str(exc), res)
        finally:
            self.heartbeat.beat(res, None)
        if reply.status == 413 and len(items) > 1:  # the service takes less than this node's config says
            half = len(items) // 2
            return self._send(items[:half], res) and self._send(items[half:], res)
        if reply.status == 413:
            self._quarantine(items[0].path, f"the service refuses it as too large: {reply.reason()}", res)
            return True
        if reply.status == 503 and reply.retry_after_s is not None:
            res.retry_after_s = reply.retry_after_s
        if reply.status != 200:
            return self._failed(items, f"the service refused the push: HTTP {reply.status}: {reply.reason()}", res)
        return self._acknowledged(items, reply, res)

    def _acknowledged(self, items: list[_Item], reply: Reply, res: PassResult) -> bool:
        try:
            acked = set(orjson.loads(reply.body)["acked"])
        except (ValueError, KeyError, TypeError) as exc:
            return self._failed(items, f"cannot read the service's reply: {exc}", res)
        left = 0
        for item in items:
            if os.path.basename(item.path) not in acked:
                left += 1
                continue
            res.acked += 1
            res.from_fallback += item.fallback
            try:
                st = os.lstat(item.path)
                if (st.st_ino, st.st_mtime_ns) == item.ident:
                    os.unlink(item.path)
            except FileNotFoundError:
                pass
            except OSError as exc:  # acknowledged: a leftover file is only sent again, harmlessly
                log.warning("cannot remove forwarded record %s: %s", item.path, exc)
        if left:
            res.left += left
            res.ok = False
            res.errors.append(f"the service left {left} record(s) for later (its log says why)")
        return True

    def _failed(self, items: list[_Item], why: str, res: PassResult) -> bool:
        res.ok = False
        res.left += len(items)
        res.errors.append(why)
        return False

    def _quarantine(self, path: str, why: str, res: PassResult) -> None:
        """Into the quarantine of the spool that holds ``path`` (a fallback's own: the spool may be full)."""
        try:
            dest = spool.quarantine(_spool_of(path), path, why)
        except FileNotFoundError:
            return
        except OSError as exc:
            res.left += 1
            res.ok = False
            res.errors.append(f"{path}: {why}; and cannot quarantine it: {exc}")
            return
        res.quarantined_here += 1
        log.warning("quarantined %s: %s", dest, why)


def _spool_of(path: str) -> str:
    """The spool (or fallback spool) that holds a record's path: ``<spool>/incoming/<name>``."""
    return os.path.dirname(os.path.dirname(path))


def _spool_log(level: str, msg: str) -> None:
    """spool.drain_fallbacks' log, into this process's."""
    log.log(logging.WARNING if level == "warning" else logging.ERROR if level == "error" else logging.INFO, "%s", msg)


class Heartbeat:
    """``<state_dir>/forward.json``, rewritten at each pass and push: whether the forwarder runs (read by
    ``gpueff doctor --role node``). Not durable (a reboot ends the forwarder too), never fatal: a state dir
    that cannot be written is logged once and the records still go."""

    def __init__(self, config: Config):
        self.path = statedir.forward_heartbeat(config.paths.state_dir)
        self.push_s = float(config.service.api_timeout_s)
        self.once = False
        self.failed = False
        self.pass_started = time.time()

    def beat(self, res: PassResult | None, next_in_s: float | None, *, stopped: bool = False) -> None:
        """``next_in_s``: the wait before the next pass (None: within a pass, the next write is due within a
        push's time)."""
        now = time.time()
        due = None if stopped or (self.once and next_in_s is not None) else now + (
            self.push_s * 2 if next_in_s is None else next_in_s)
        data: dict[str, Any] = {"pid": os.getpid(), "time": now, "pass_started": self.pass_started,
                                "next_due": due, "once": self.once, "stopped": stopped}
        if res is not None:
            data.update(acked=res.acked, from_fallback=res.from_fallback, moved_back=res.moved_back,
                        quarantined_here=res.quarantined_here, left=res.left, ok=res.ok,
                        error=res.errors[0] if res.errors else None)
        try:
            os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
            spool.atomic_write(self.path, orjson.dumps(data), mode=0o644, durable=False)
        except OSError as exc:
            if not self.failed:
                log.warning("cannot write the heartbeat %s (%s): `gpueff doctor` will say the forwarder does "
                            "not run", self.path, exc)
            self.failed = True


def read_heartbeat(config: Config) -> dict[str, Any] | None:
    """The forwarder's last heartbeat; None when there is none (never ran since the state dir was made)."""
    try:
        with open(statedir.forward_heartbeat(config.paths.state_dir), "rb") as fh:
            data = orjson.loads(fh.read(65536))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        return {"unreadable": str(exc)}
    return data if isinstance(data, dict) else {"unreadable": "not a JSON object"}


def run_forwarder(config: Config, stop: threading.Event, *, once: bool = False, batch: int | None = None) -> int:
    """Until ``stop`` is set: a pass, then wait ``service.forward_interval_s`` (±10 %, so that a site's
    nodes spread out; longer after failures, doubling; after "busy", the service's Retry-After: the turn it
    gave this node). Exit status (with ``once``: 1 if records were left)."""
    fwd = Forwarder(config, batch or BATCH)
    fwd.heartbeat.once = once
    fwd.heartbeat.beat(None, None)  # running: before a first pass that a backlog may make long
    interval = config.service.forward_interval_s
    delay = interval
    while True:
        fwd.heartbeat.pass_started = time.time()
        res = fwd.run_pass()
        for e in res.errors:
            log.warning("%s", e)
        if res.acked or res.quarantined_here or res.moved_back:
            log.info("forwarded %d (%d from fallback spools), moved back from fallback spools %d, quarantined "
                     "here %d, left in the spool %d", res.acked, res.from_fallback, res.moved_back,
                     res.quarantined_here, res.left)
        if once:
            fwd.heartbeat.beat(res, 0.0)
            return 0 if res.ok and not res.left else 1
        if res.ok:
            delay = interval
        elif res.retry_after_s is not None:  # the service is up, storing other nodes' pushes: its turn for us
            delay = min(max(res.retry_after_s, 1.0), MAX_RETRY_AFTER_S)
        else:
            delay = min(max(delay, interval) * 2, config.service.forward_max_backoff_s)
        wait = delay * random.uniform(0.9, 1.1)
        fwd.heartbeat.beat(res, wait)
        if stop.wait(wait):
            fwd.heartbeat.beat(res, None, stopped=True)
            return 0
