"""Reports: per-job efficiency cards by mail when jobs end, and monthly GPU-hour waste summaries.

Each report is query -> data -> template: the SQL (storage/summaries.py for a month, ``cards_due`` for the
jobs due a card), a presenter (``card``, ``monthly`` with ``prices``) that builds the template context, and
the Jinja2 templates in ``templates/``, where the words are, rendered by ``pages``. Then ``charts``,
``message`` (MIME + archive), ``smtp``, ``sentlog`` (sent-log, opt-out, rate limit) and ``runner`` (who
gets what).
"""
