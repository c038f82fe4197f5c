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
"""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
from dataclasses import dataclass, field

import orjson

from .. import spool
from ..access.client import RECORDS_PATH, Reply, Unreachable, api_url, post_signed
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
    ok: bool = True
    errors: list[str] = field(default_factory=list)
    retry_after_s: float | None = None  # the service was busy and said when to come back


@dataclass
class _Item:
    path: str
    data: bytes  # the record's JSON
    ident: tuple[int, int]  # (inode, mtime ns) when read: a file replaced since is not deleted


class Forwarder:
    """This node's spool, the service's address, and what a pass needs between passes."""

    def __init__(self, config: Config, batch: int = BATCH):
        from ..storage.ingest import configured_trust

        if not api_url(config.service):
            raise ConfigError("gpueff forward pushes records to gpueff serve: set [service] api_url to the service's "
                              "address (e.g. http://gpueff.example.org:9820), as on login nodes")
        self.config = config
        self.spool_dir = config.paths.spool_dir
        self.trust = configured_trust(config)
        self.batch = max(1, batch)
        self.max_bytes = int(config.service.push_max_mb * 1024 * 1024)
        self.node = socket.gethostname().split(".")[0]

    def run_pass(self) -> PassResult:
        """Send everything waiting in the spool, in pushes; stop at the first push that is not answered."""
        res = PassResult()
        paths = [p for group in spool.pending_by_job(self.spool_dir, stale_tmp_s=spool.STALE_TMP_S) for p in group]
        items: list[_Item] = []
        size = _ENVELOPE
        for n, path in enumerate(paths):
            item = self._read(path, res)
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

    def _read(self, path: str, res: PassResult) -> _Item | None:
        from ..storage.ingest import read_json

        try:
            st = os.lstat(path)
            rec = read_json(path, self.trust)
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
        return _Item(path, data, (st.st_ino, st.st_mtime_ns))

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
        try:
            dest = spool.quarantine(self.spool_dir, path, why)
        except FileNotFoundError:
            return
        except OSError as exc:
            res.left += 1
            res.ok = False
            res.errors.append(f"{path}: {why}; and cannot quarantine it: {exc}")
            return
        res.quarantined_here += 1
        log.warning("quarantined %s: %s", dest, why)


def run_forwarder(config: Config, stop: threading.Event, *, once: bool = False, batch: int | None = None) -> int:
    """Until ``stop`` is set: a pass, then wait ``service.forward_interval_s`` (±10 %, so that a site's
    nodes spread out; longer after failures, doubling; after "busy", the service's Retry-After: the turn it
    gave this node). Exit status (with ``once``: 1 if records were left)."""
    fwd = Forwarder(config, batch or BATCH)
    interval = config.service.forward_interval_s
    delay = interval
    while True:
        res = fwd.run_pass()
        for e in res.errors:
            log.warning("%s", e)
        if res.acked or res.quarantined_here:
            log.info("forwarded %d, quarantined here %d, left in the spool %d", res.acked, res.quarantined_here,
                     res.left)
        if once:
            return 0 if res.ok and not res.left else 1
        if res.ok:
            delay = interval
        elif res.retry_after_s is not None:  # the service is up, storing other nodes' pushes: its turn for us
            delay = min(max(res.retry_after_s, 1.0), MAX_RETRY_AFTER_S)
        else:
            delay = min(max(delay, interval) * 2, config.service.forward_max_backoff_s)
        if stop.wait(delay * random.uniform(0.9, 1.1)):
            return 0
