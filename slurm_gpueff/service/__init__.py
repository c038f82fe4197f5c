"""The long-running service (``gpueff serve``): scheduled ingest, enrichment, rollups, retention, reports,
a Prometheus ``/metrics`` endpoint, and the HTTP API that users read through and nodes push records to."""
