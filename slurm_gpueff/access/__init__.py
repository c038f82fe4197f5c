"""Who is asking, who wrote it, and what they may see: MUNGE credentials between seff-gpu and the service
(:mod:`.munge`), the privacy rules every path applies (:mod:`.privacy`), the peer of a socket (:mod:`.peer`)
and the spool files the nodes wrote (:mod:`.spool_trust`). Stdlib only, but the spool's reader (orjson:
ingest's and the forwarder's, never the hook's or seff-gpu's)."""
