"""``gpueff forward``: ship this node's spooled records to the central database (PostgreSQL).

The forwarder is ingest run on the node: ingest commits a batch and only then unlinks its files, and
re-ingesting a record is harmless (natural keys), so:

- database down for hours: every attempt fails before the commit, the files stay; retries back off
  (doubling up to ``service.forward_max_backoff_s``);
- killed at any point (even ``kill -9`` between commit and unlink): the next run re-sends what is left
  and the rows come out the same; nothing is lost, nothing is duplicated.

Nodes never change the schema; ``gpueff serve`` on the service host computes summaries and rollups.
"""

from __future__ import annotations

import logging
import threading

from ..config import Config
from ..errors import ConfigError

log = logging.getLogger("gpueff.forward")


def run_forwarder(config: Config, stop: threading.Event, *, once: bool = False, batch: int | None = None) -> int:
    """Until ``stop`` is set: forward, sleep ``service.forward_interval_s`` (longer after failures). Exit status."""
    from ..storage.db import engine_for, first_line
    from ..storage.dburl import database_url
    from ..storage.ingest import BATCH, configured_trust, ingest_spool

    url = database_url(config.paths.database)
    if url.startswith("sqlite"):
        raise ConfigError(f"paths.database is SQLite ({url}): forwarding needs a database server "
                          "(postgresql+psycopg://...); with SQLite use a shared spool instead")
    delay = interval = config.service.forward_interval_s
    engine = None
    try:
        while True:
            try:
                engine = engine or engine_for(config.paths, create=False)
                res = ingest_spool(engine, config.paths.spool_dir, batch=batch or BATCH,
                                   trust=configured_trust(config))
            except Exception as exc:  # noqa: BLE001 - bad URL, driver missing: report and retry
                log.error("cannot reach the database: %s", first_line(exc))
                ok = False
            else:
                for e in res.errors:
                    log.warning("%s", e)
                if res.ingested or res.quarantined or res.failed:
                    log.info("forwarded %d, quarantined %d, left in the spool %d", res.ingested, res.quarantined,
                             res.failed)
                ok = res.failed == 0
            if once:
                return 0 if ok else 1
            delay = interval if ok else min(max(delay, interval) * 2, config.service.forward_max_backoff_s)
            if stop.wait(delay):
                return 0
    finally:
        if engine is not None:
            engine.dispose()
