"""What a simulated site's database holds of the jobs the bench sent: lost by job id, duplicated by content.

The benches send each job's final record once (they requeue nothing), so a job id of theirs must end as one
``job`` row from a final record, whatever its run, and each of its GPUs as one ``job_gpu`` row. Counted so
that a fault can show:

- lost: a job id sent with no row from a final record (``record_source`` ``hook``), whatever run it was
  stored under;
- duplicated jobs: a job id sent with more than one row, under any run or record source (a unique key on
  ``(cluster, job_id, run)`` cannot see a second row under another run);
- duplicated GPUs: a GPU (by UUID) stored more than once for one job, under any node or index.

tests/test_bench_counts.py plants a loss and both kinds of duplicate and sees each counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from sqlalchemy import Engine, text


class Counts(NamedTuple):
    sent: int
    stored: int  # job ids with a row from a final record
    lost: int
    duplicated_jobs: int  # job ids with more than one row
    duplicated_gpus: int  # (job row, GPU UUID) pairs stored more than once

    def line(self) -> str:
        return (f"finals stored {self.stored:,} of {self.sent:,}: lost {self.lost}, duplicated {self.duplicated_jobs} "
                f"jobs and {self.duplicated_gpus} GPUs")


def counts(engine: Engine, cluster: str, job_ids: Iterable[int]) -> Counts:
    """The counts over the job ids the bench sent (a temporary table holds them: 10,000s of ids), in one
    transaction of their own."""
    ids = sorted(set(job_ids))
    with engine.begin() as conn:
        conn.execute(text("CREATE TEMP TABLE sent_ids (job_id bigint PRIMARY KEY)"))
        for k in range(0, len(ids), 10_000):
            conn.execute(text("INSERT INTO sent_ids (job_id) VALUES (:j)"), [{"j": j} for j in ids[k:k + 10_000]])
        where = "j.cluster = :c"
        stored = conn.execute(text(f"SELECT count(DISTINCT j.job_id) FROM job j JOIN sent_ids USING (job_id) "
                                   f"WHERE {where} AND j.record_source = 'hook'"), {"c": cluster}).scalar_one()
        dup_jobs = conn.execute(text(f"SELECT count(*) FROM (SELECT j.job_id FROM job j JOIN sent_ids USING (job_id) "
                                     f"WHERE {where} GROUP BY j.job_id HAVING count(*) > 1) x"),
                                {"c": cluster}).scalar_one()
        dup_gpus = conn.execute(text(f"SELECT count(*) FROM (SELECT g.job_pk, g.uuid FROM job_gpu g "
                                     f"JOIN job j ON j.id = g.job_pk JOIN sent_ids USING (job_id) "
                                     f"WHERE {where} AND g.uuid IS NOT NULL GROUP BY g.job_pk, g.uuid "
                                     f"HAVING count(*) > 1) x"), {"c": cluster}).scalar_one()
        conn.execute(text("DROP TABLE sent_ids"))
    return Counts(len(ids), int(stored), len(ids) - int(stored), int(dup_jobs), int(dup_gpus))
