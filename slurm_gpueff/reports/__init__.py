"""Reports: per-job efficiency cards by mail when jobs end, and monthly GPU-hour waste summaries.

Sits above storage, analysis and render (like :mod:`slurm_gpueff.summarize`); nothing below it imports
it. Each report is query -> data -> template: ``queries`` (SQL only, plain data), a presenter that
formats the data into a template context (``card``: one job; ``monthly``: a month, with ``prices``), and
the Jinja2 templates in ``templates/`` (package data), where the words are. Then ``charts`` (PNG),
``message`` (MIME + archive), ``smtp`` (delivery), ``sentlog`` (sent-log, opt-out, rate limit) and
``runner`` (who gets what; what the CLI and the scheduler call).
"""
