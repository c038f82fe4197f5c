"""Jobs on a shared GPU through Slurm's gres/shard, on each version: two jobs side by side on one GPU's shards
are each recorded with their own share of its GPU-hours, so the GPU's hours are counted once.

The test clusters give every fake GPU 4 shards (conftest.SHARDS_PER_GPU). Each version's slurmd hooks see a
shard job exactly as a whole-GPU one (SLURM_JOB_GPUS and CUDA_VISIBLE_DEVICES name the GPU; nothing names the
shards: docs/SLURM-VERSIONS.md), so the record first claims the whole GPU. Enrichment reads the shards from
accounting (AllocTRES ``gres/shard=N``) and the GPU's count from ``scontrol show node -d``; from then on the
job's GPU-hours are its share and the GPU's device-wide activity is never shown as the job's own.
"""

from __future__ import annotations

from datetime import datetime

import pytest

from .conftest import CLUSTER, SHARDS_PER_GPU, USER, SlurmCluster

pytestmark = pytest.mark.slurm


def _gpu_rows(c: SlurmCluster, job_id: int) -> list:
    return c.rows("SELECT g.* FROM job_gpu g JOIN job j ON j.id = g.job_pk WHERE j.cluster = ? AND j.job_id = ?",
                  (CLUSTER, job_id))


def test_shard_jobs_on_one_gpu_get_their_share_of_its_hours(slurm: SlurmCluster):
    c = slurm
    held = {c.sbatch("--gres=shard:1", "-J", "shard1", "--wrap", "sleep 5", user=USER): 1,
            c.sbatch("--gres=shard:3", "-J", "shard3", "--wrap", "sleep 5", user=USER): 3}
    ids = sorted(held)
    c.wait_state(ids, {"RUNNING"}, timeout=60)  # side by side: 1 + 3 shards of the 4 of one GPU
    assert all(s == "COMPLETED" for s in c.wait_state(ids).values())
    c.wait_node_idle()
    assert "ingested 2," in c.gpueff("ingest").stdout
    gpus = {j: _gpu_rows(c, j) for j in ids}
    assert all(len(g) == 1 and g[0]["shards"] is None for g in gpus.values())  # the hooks saw a whole GPU
    assert gpus[ids[0]][0]["gpu_index"] == gpus[ids[1]][0]["gpu_index"], "the two jobs were given one GPU"
    c.wait_accounted(ids)
    c.settle()
    c.gpueff("enrich", "--since", "now-1d")
    c.gpueff("ingest")  # analyses the enriched rows again
    c.gpueff("rollup")
    for j in ids:
        (g,) = _gpu_rows(c, j)
        assert (g["shards"], g["shard_count"]) == (held[j], SHARDS_PER_GPU), dict(g)
        row = c.job_row(j)
        window = datetime.fromisoformat(g["end_time"]) - datetime.fromisoformat(g["start_time"])  # the GPU's own
        window_h = window.total_seconds() / 3600
        assert row["gpu_hours"] == pytest.approx(window_h * held[j] / SHARDS_PER_GPU), (dict(row), dict(g))
        assert row["idle_gpu_hours"] is None and row["energy_j"] is None  # the device's, not this job's own
        card = c.seff(j, user=USER)
        assert card.returncode == 0, card.stderr
        text = " ".join(card.stdout.split())
        assert f"shared ({held[j]} of {SHARDS_PER_GPU} shards)" in text, card.stdout
        assert "Kernel-active: n/a (the shared GPU's as a whole" in text, card.stdout
    # the GPU's hours once across its two jobs: the month's rollup holds each job's share
    month = c.job_row(ids[0])["end_time"][:7]
    (rollup,) = c.rows("SELECT sum(gpu_hours) AS h FROM usage_rollup WHERE period = 'month' "
                       "AND substr(period_start, 1, 7) = ?", (month,))
    (table,) = c.rows("SELECT sum(gpu_hours) AS h FROM job WHERE analyzed_at IS NOT NULL AND "
                      "record_source != 'live' AND substr(end_time, 1, 7) = ?", (month,))
    assert rollup["h"] == pytest.approx(table["h"])
