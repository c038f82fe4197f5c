"""Storage layer: engine setup, ingest of spool records, and queries. Imports models, never analysis/render."""
