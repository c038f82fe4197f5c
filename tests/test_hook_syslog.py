"""The Epilog's errors reach syslog, also where slurmd keeps no hook stderr, on every error path: the record
written to a fallback spool (persistent, or a tmpfs said to be lost on reboot), the record written nowhere
(it goes to syslog itself, in parts a syslog daemon takes), a broken install; and a syslog daemon that stopped
reading does not hold the hook past its bound.

Real processes: the installed hook scripts run as slurmd runs them (root, no PATH, stderr closed), each in a
mount namespace of its own (tests/nsrun.py) whose /dev/log is a datagram socket this test reads, and where
tmpfs mounts stand for /run, /tmp and /var/tmp of a node, and read-only ones for places nothing can be
written. The GPUs are the simulated backend's (no GPU here).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys

import nsrun
import pytest
from hooksite import HOOKS, HookSite

from slurm_gpueff import record, spool

MARGIN_S = 3.0  # interpreter start-up and exit on a loaded 2-core CI machine
ERR = "<27>"  # LOG_DAEMON | LOG_ERR
pytestmark = [pytest.mark.process, pytest.mark.skipif(nsrun.unusable() is not None,
                                                      reason=str(nsrun.unusable()))]


@pytest.fixture
def node(tmp_path):
    """(site, syslog socket): a node whose spool path lies under a regular file (ENOTDIR, even for root)."""
    site = HookSite(str(tmp_path))
    blocker = os.path.join(site.base, "not-a-dir")
    with open(blocker, "w") as fh:
        fh.write("x")
    site.write_config(paths={"spool_dir": os.path.join(blocker, "spool"), "state_dir": site.state})
    log = nsrun.SyslogSocket(os.path.join(site.base, "log.sock"))
    yield site, log
    log.close()


def hook(site: HookSite, log: nsrun.SyslogSocket, kind: str, job: int, *, env: dict[str, str] | None = None,
         tmpfs: tuple[str, ...] = (), ro: tuple[str, ...] = (), hooks: str = HOOKS, timeout: float = 60):
    e = env if env is not None else site.env(job)
    if kind == "epilog":
        e.setdefault("SLURM_JOB_EXIT_CODE2", "0:0")
        e.setdefault("SLURM_SCRIPT_CONTEXT", "epilog_slurmd")
    return nsrun.run([sys.executable, os.path.join(hooks, kind)], base=site.base, devlog=log.path, env=e,
                     tmpfs=tmpfs, ro=ro, cwd=site.logdir, timeout=timeout)


def errors(lines: list[str]) -> list[str]:
    return [ln for ln in lines if ln.startswith(ERR) and "slurm-gpueff[" in ln]


def test_a_record_in_a_persistent_fallback_is_said_in_syslog_with_no_stderr(node):
    site, log = node
    for kind in ("prolog", "epilog"):
        p, _ = hook(site, log, kind, 801)
        assert p.returncode == 0 and p.stderr == "", p.stderr  # stderr closed: nothing there to read
    fallback = os.path.join(site.state, "spool-fallback")
    assert record.validate(site.record(801, spool=fallback))["job_id"] == 801
    said = errors(log.lines())
    assert len(said) == 1, said
    assert re.search(r"slurm-gpueff\[\d+\]: epilog: spool \S+ is not writable \(.*Not a directory.*\); wrote "
                     + re.escape(os.path.join(fallback, "incoming", "job-801-node01.json")) + r" instead "
                     r"\(persistent storage\)", said[0]), said[0]


def test_a_tmpfs_fallback_is_the_last_resort_and_said_to_be_lost_on_reboot(node):
    """/tmp, /var/tmp and the state dir are tmpfs (as /run is on a node): the record goes to one of them only
    because nothing persistent takes it, and syslog says a reboot loses it."""
    site, log = node
    os.makedirs(site.state, exist_ok=True)
    env = site.env(802)
    del env["TMPDIR"]
    for kind in ("prolog", "epilog"):
        p, _ = hook(site, log, kind, 802, env=dict(env), tmpfs=(site.state, "/tmp", "/var/tmp"))
        assert p.returncode == 0
    said = errors(log.lines())
    assert len(said) == 1 and "(not persistent: lost on reboot; set paths.spool_fallback_dir" in said[0], said


def test_persistent_places_come_before_a_tmpfs_state_dir(node):
    """The state dir (first in the written order) is a tmpfs, $TMPDIR is on disk: the record goes to $TMPDIR."""
    site, log = node
    os.makedirs(site.state, exist_ok=True)
    for kind in ("prolog", "epilog"):
        p, _ = hook(site, log, kind, 803, tmpfs=(site.state,))
        assert p.returncode == 0
    # the namespace's tmpfs is gone: what was written to disk is all there is
    rec = site.record(803, spool=os.path.join(site.tmpdir, spool.FALLBACK_NAME))
    assert rec["job_id"] == 803
    said = errors(log.lines())
    assert len(said) == 1 and spool.FALLBACK_NAME in said[0] and "(persistent storage)" in said[0], said


def test_a_stuck_syslog_daemon_does_not_hold_the_hook_past_its_bound(node):
    """A syslog daemon that stopped reading (its queue full) blocks syslog(3); the Epilog still writes the record
    and exits 0 within collector.hook_timeout_s."""
    site, log = node
    site.write_config(collector={"hook_timeout_s": 2.0})  # the spool works again: a plain job
    hook(site, log, "prolog", 805)
    assert log.fill() > 0
    p, wall = hook(site, log, "epilog", 805)
    assert p.returncode == 0
    assert wall < 2.0 + MARGIN_S, f"the Epilog took {wall:.1f} s"
    assert site.record(805)["job_id"] == 805


def test_a_broken_install_is_said_in_syslog(node, tmp_path):
    """The hook script cannot import the package (a broken upgrade): it exits 0 and syslog says why."""
    site, log = node
    tree = tmp_path / "broken"
    (tree / "slurm_gpueff").mkdir(parents=True)
    (tree / "slurm_gpueff" / "__init__.py").write_text("raise ImportError('half-installed upgrade')\n")
    shutil.copytree(HOOKS, tree / "hooks")
    p, _ = hook(site, log, "epilog", 806, hooks=str(tree / "hooks"))
    assert p.returncode == 0
    said = errors(log.lines())
    assert len(said) == 1 and "epilog: cannot import slurm_gpueff" in said[0] and "half-installed" in said[0], said


def _parts(lines: list[str]) -> str:
    """The parts of one long syslog line, put back together."""
    found = sorted((int(m.group(1)), int(m.group(2)), m.group(3)) for ln in lines
                   if (m := re.search(r"epilog: \[part (\d+)/(\d+)\] (.*)$", ln, re.S)))
    assert found and [i for i, _n, _t in found] == list(range(1, found[0][1] + 1)), found
    return "".join(t for _i, _n, t in found)


def test_a_record_written_nowhere_is_kept_whole_in_syslog(node):
    """Nothing can be written (the spool, and every fallback read-only or not ours): the record itself goes to
    syslog, in numbered parts no larger than a syslog daemon takes, and put back together it is the job's
    valid record."""
    site, log = node
    env = site.env(807)
    env["TMPDIR"] = os.path.join(site.base, "ro-tmp")
    os.makedirs(env["TMPDIR"])
    ro = (site.state, env["TMPDIR"], "/var/tmp", os.path.join("/tmp", spool.FALLBACK_NAME))
    for kind in ("prolog", "epilog"):
        p, wall = hook(site, log, kind, 807, env=dict(env), tmpfs=("/tmp",), ro=ro)
        assert p.returncode == 0 and wall < 10 + MARGIN_S
    lines = errors(log.lines())
    assert all(len(ln) < 2200 for ln in lines), max(len(ln) for ln in lines)
    text = _parts(lines)
    assert text.startswith("could not write the job record anywhere"), text[:200]
    rec = record.validate(json.loads(text.split("record follows: ", 1)[1]))
    assert rec["job_id"] == 807 and rec["user"] == "alice"
