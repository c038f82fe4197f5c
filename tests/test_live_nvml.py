"""The nvml backend's live figures: ``peek`` right after an agent reading gives what an Epilog at that moment
would, and leaves the job measured on to its end. The GPU is the only mock (tests/fake_gpus.py, a scripted
sampler); the agent, its state file and the hook-side collector are the real ones."""

from __future__ import annotations

from fake_gpus import close, hopper
from test_nvml_collector import U0, Node, _as_record, _job

BUSY = {"kernel_pct": 100, "power_mw": 400_000.0, "gpm": {"sm_active": 80, "tensor_active": 60}}
IDLE = {"kernel_pct": 0, "power_mw": 70_000.0, "gpm": {"sm_active": 0, "tensor_active": 0}}


def test_peek_equals_an_epilog_at_that_reading_and_the_job_goes_on(tmp_path):
    n = Node(tmp_path, [hopper(U0)], [0])
    n.ticks(2)
    job = _job(n, [0])
    st = n.prolog(job)
    n.ticks(4, **{U0: BUSY})  # 20 s busy
    (so_far,) = n.coll.peek(job, st).gpus
    assert n.coll.ask_agent, "peek must leave the collector asking the agent again"
    assert so_far["window"]["end_exact"] and so_far["measured_s"] == 20.0
    assert close(so_far["kernel_active"], 1.0) and close(so_far["sm_active"], 0.8)
    assert close(so_far["energy_j"], 20 * 400, 1e-3)
    n.ticks(4, **{U0: IDLE})  # then 20 s idle
    (final,) = n.coll.stop(job, st).gpus
    assert final["measured_s"] == 40.0
    assert close(final["kernel_active"], 0.5) and close(final["sm_active"], 0.4)
    assert close(final["energy_j"], 20 * 400 + 20 * 70, 1e-3)
    _as_record(job, n.coll.peek(job, st))
