"""A heterogeneous job whose two components run on two nodes, on real Slurm 24.11 and 26.05, read right after
it ends, before ``gpueff enrich``: each component is labelled as Slurm labels it.

Each slurmd's hooks see the component's own raw id and the het job id (SLURM_HET_JOB_ID), never its offset,
so both records carry the het job id and neither an offset. ``seff-gpu 13+0`` used to say "2 jobs match
13+0" and label the other component 13+0 too; ``seff-gpu 13`` labelled the parts by their raw ids. A het
job never starts on one node (backfill plans whole nodes per component), so these clusters have two slurmds
in one chroot (tests/slurm/chroot/README.md); 22.05 runs on the host with one node and is not here.

Everything is real: the daemons, accounting, the hooks under both slurmds, ingest, sacct and seff-gpu (as
root and as the job's owner); only the GPUs are fake (the simulated collector).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from slurm.conftest import USER, VERSIONS, SlurmCluster, running_cluster

pytestmark = [pytest.mark.slurm, pytest.mark.process]
HET_VERSIONS = [v for v in VERSIONS if v in ("24.11", "26.05")]


@pytest.fixture(scope="module", params=HET_VERSIONS, ids=lambda v: f"slurm-{v}-2nodes")
def two_nodes(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    with running_cluster(request.param, nnodes=2) as c:
        yield c


def shown_ids(out: str) -> list[str]:
    return [ln.split("Job ID: ", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Job ID: ")]


def test_a_het_job_on_two_nodes_is_labelled_by_component_before_accounting(two_nodes):
    c = two_nodes
    het = c.sbatch("-N1", "--gres=gpu:1", "-J", "het", ":", "-N1", "--gres=gpu:1", "--wrap", "sleep 2", user=USER)
    c.wait_state([het])
    c.wait_accounted([het, het + 1])
    deadline = time.monotonic() + 30
    while len(c.spool_files()) < 2 and time.monotonic() < deadline:  # each node's Epilog writes its record
        time.sleep(0.2)
    assert "ingested 2," in c.gpueff("ingest").stdout
    rows = {r["job_id"]: r for r in c.rows("SELECT * FROM job WHERE het_job_id = ?", (het,))}
    assert sorted(rows) == [het, het + 1] and {r["het_job_offset"] for r in rows.values()} == {None}
    assert not any(r["enriched"] for r in rows.values())
    nodes = c.rows("SELECT DISTINCT g.node FROM job_gpu g JOIN job j ON j.id = g.job_pk WHERE j.het_job_id = ?", (het,))
    assert len(nodes) == 2, [n["node"] for n in nodes]  # a component on each node

    assert shown_ids(c.seff(het).stdout) == [f"{het}+0 (raw id {het})", f"{het}+1 (raw id {het + 1})"]  # root
    for user in (USER,):  # and the job's owner, through the service
        one = c.seff(f"{het}+0", user=user)
        assert one.returncode == 0 and "jobs match" not in one.stdout, one.stdout + one.stderr
        assert shown_ids(one.stdout) == [f"{het}+0 (raw id {het})"], one.stdout
        other = c.seff(f"{het}+1", user=user)
        assert shown_ids(other.stdout) == [f"{het}+1 (raw id {het + 1})"], other.stdout + other.stderr
        both = c.seff(het, user=user)
        assert both.stdout.startswith(f"2 jobs match {het}\n"), both.stdout + both.stderr
        assert shown_ids(both.stdout) == [f"{het}+0 (raw id {het})", f"{het}+1 (raw id {het + 1})"]
        assert "final state not read from accounting yet" in " ".join(both.stdout.split())
    (doc,) = json.loads(c.seff(f"{het}+0", "--json", user=USER).stdout)["jobs"]
    assert (doc["job"]["job_id"], doc["job"]["het_job_id"], doc["job"]["het_job_offset"]) == (het, het, 0)

    c.settle()
    c.gpueff("enrich", "--since", "now-1d")  # after accounting: the same labels, from the database
    rows = {r["job_id"]: r for r in c.rows("SELECT * FROM job WHERE het_job_id = ?", (het,))}
    assert {j: r["het_job_offset"] for j, r in rows.items()} == {het: 0, het + 1: 1}
    both = c.seff(het, user=USER)
    assert shown_ids(both.stdout) == [f"{het}+0 (raw id {het})", f"{het}+1 (raw id {het + 1})"]
    assert "State: COMPLETED (exit code 0)" in both.stdout
