"""Reports: per-job efficiency cards by mail when jobs end, and monthly GPU-hour waste summaries.

Sits above storage, analysis and render (like :mod:`slurm_gpueff.summarize`): it reads jobs and the
stored per-job summaries, renders Jinja2 templates (kept in the repository's top-level ``reports/``
folder; ``templates`` here is a link to it, so the wheel carries them), draws PNG charts with
matplotlib, and delivers over SMTP with a sent-log in the database. Nothing below it imports it.

Modules: ``fmt`` (numbers and money), ``templates`` (Jinja2), ``charts`` (PNG), ``card`` (one job),
``monthly`` (SQL aggregates + summary), ``message`` (MIME + archive), ``smtp`` (delivery),
``sentlog`` (sent-log, opt-out, rate limit), ``runner`` (who gets what; what the CLI and scheduler call).
"""
