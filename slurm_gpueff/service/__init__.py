"""The long-running service (``gpueff serve``): scheduled ingest, enrichment, rollups, retention, reports,
and a Prometheus ``/metrics`` endpoint; plus the node-side forwarder (``gpueff forward``)."""
