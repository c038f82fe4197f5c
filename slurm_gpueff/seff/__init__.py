"""seff-gpu's question-and-answer engine: a query and who asks in, an answer out, the same for every path.

:mod:`.query` (the query, the answer and its statuses: what travels between seff-gpu, the service and the
node agent), :mod:`.answer` (the one flow: cards and tables), :mod:`.lookup` (the rows it reads),
:mod:`.sqlite_read` (SQLite with the standard library) and :mod:`.livecard` (a running job's card on its own
node, answered by the agent). Import-free: seff-gpu's client side imports :mod:`.query` alone.
"""
