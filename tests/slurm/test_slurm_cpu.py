"""The CPU side from real accounting: a GPU job that burns CPU and holds ~300 MB, enriched, on each version.

jobacct_gather/linux samples every second (start-slurm.sh), so TotalCPU and MaxRSS of its steps are
Slurm's own; enrichment reads them with the version-independent step query (sacct_steps.py).
"""

from __future__ import annotations

import pytest

from .conftest import USER, SlurmCluster

pytestmark = pytest.mark.slurm

BURN = ("i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; "
        "dd if=/dev/zero of=/dev/null bs=300M count=60 2>/dev/null; echo GPUS=$SLURM_JOB_GPUS")


def test_cpu_efficiency_and_peak_host_memory_come_from_accounting(slurm: SlurmCluster):
    c = slurm
    job = c.sbatch("--gres=gpu:1", "-J", "burn", "--wrap", BURN, user=USER)
    assert c.wait_state([job])[job] == "COMPLETED"
    c.wait_node_idle()
    c.gpueff("ingest")
    c.wait_accounted([job])
    c.settle()
    c.gpueff("enrich", "--since", "now-1d")
    row = c.job_row(job)
    assert row is not None and row["enriched"]
    assert row["alloc_cpus"] >= 1 and row["total_cpu_s"] > 0.3, dict(row)
    assert row["max_rss_bytes"] > 200 * 2**20, dict(row)
    card = " ".join(c.seff(job).stdout.split())
    assert f"of {row['alloc_cpus']} CPU" in card and "peak host memory" in card and "CPU: efficiency n/a" not in card
