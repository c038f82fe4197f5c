"""Who is asking and what they may see: MUNGE credentials between seff-gpu and the service
(:mod:`.munge`), and the privacy rules every path applies (:mod:`.privacy`). Stdlib only."""
