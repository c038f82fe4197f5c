"""The privacy rules (slurm_gpueff.access.privacy) as tables of cases: who sees which card, who may list which
table. The same functions decide on seff-gpu's direct path and in the service's API (tests/test_api.py
runs them end to end with MUNGE)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from slurm_gpueff.access.privacy import Denied, Viewer, may_see, shown, table_scope, viewer
from slurm_gpueff.config import Config

SERVICE_UID = 990
COORDS = {"physics": ["carol"], "chem": ["dave", "erin"]}


def privacy(leads=None, **kw):
    """A Config with these [privacy] keys and [leads] (the rules read both)."""
    return Config({"privacy": kw, "leads": leads or {}})


def job(user, uid, account):
    return SimpleNamespace(user=user, uid=uid, account=account)


ALICE_VISION = job("alice", 1001, "vision")
BOB_PHYSICS = job("bob", 1002, "physics")
NO_UID = job("alice", None, "vision")  # a record without a uid: matched by name

# (case, [privacy] keys and leads= for [leads], (uid, name), job, visible?)
CARDS = [
    ("own job", {}, (1001, "alice"), ALICE_VISION, True),
    ("own job by name when no uid was recorded", {}, (1001, "alice"), NO_UID, True),
    ("a name match does not beat a recorded uid", {}, (1005, "alice"), ALICE_VISION, False),
    ("another user's job", {}, (1002, "bob"), ALICE_VISION, False),
    ("lead of the job's account ([leads])", {"leads": {"vision": ["bob"]}}, (1002, "bob"), ALICE_VISION, True),
    ("lead of another account", {"leads": {"physics": ["alice"]}}, (1001, "alice"), BOB_PHYSICS, True),
    ("lead elsewhere only", {"leads": {"chem": ["bob"]}}, (1002, "bob"), ALICE_VISION, False),
    ("Slurm coordinator of the account", {}, (1003, "carol"), BOB_PHYSICS, True),
    ("coordinator, but [privacy] coordinators = false", {"coordinators": False}, (1003, "carol"), BOB_PHYSICS,
     False),
    ("coordinator of another account", {}, (1003, "carol"), ALICE_VISION, False),
    ("admin", {"admins": ["eve"]}, (1009, "eve"), BOB_PHYSICS, True),
    ("root", {}, (0, "root"), BOB_PHYSICS, True),
    ("the service account", {}, (SERVICE_UID, "gpueff"), BOB_PHYSICS, True),
    ("privacy off", {"enabled": False}, (1009, "eve"), BOB_PHYSICS, True),
    ("a uid without a name: its own jobs by uid", {"leads": {"vision": ["alice"]}}, (1001, None),
     ALICE_VISION, True),
    ("a uid without a name", {}, (1007, None), ALICE_VISION, False),
]


@pytest.mark.parametrize(("case", "conf", "who", "the_job", "expected"), CARDS, ids=[c[0] for c in CARDS])
def test_who_sees_a_card(case, conf, who, the_job, expected):
    v = viewer(privacy(**conf), *who, service_uid=SERVICE_UID, coordinators=lambda: COORDS)
    assert may_see(v, the_job) is expected
    zed = job("zed", 4242, "zz")
    seen, hidden = shown([(the_job, ["gpus"]), (zed, [])], v)
    assert [j for j, _g in seen] == ([the_job] if expected else []) + ([zed] if v.all else [])
    assert hidden == 2 - len(seen)


def test_coordinators_are_asked_only_when_they_matter():
    calls = []

    def coordinators():
        calls.append(1)
        return COORDS

    viewer(privacy(), 0, "root", coordinators=coordinators)
    viewer(privacy(admins=["eve"]), 1009, "eve", coordinators=coordinators)
    viewer(privacy(coordinators=False), 1003, "carol", coordinators=coordinators)
    assert calls == []
    assert viewer(privacy(), 1003, "carol", coordinators=coordinators).accounts == {"physics"}
    assert calls == [1]


def test_config_leads_and_coordinators_add_up():
    v = viewer(privacy(leads={"vision": ["dave"]}), 1004, "dave", coordinators=lambda: COORDS)
    assert v.accounts == {"vision", "chem"} and not v.all


ALICE = Viewer(1001, "alice")
LEAD = Viewer(1002, "bob", accounts=frozenset({"physics"}))
ADMIN = Viewer(1009, "eve", all=True)

# (case, viewer, -u, -A, the (user, account) listed, or None: refused with exit 6)
TABLES = [
    ("no -u/-A: own jobs", ALICE, None, None, ("alice", None)),
    ("-u self", ALICE, "alice", None, ("alice", None)),
    ("-u other", ALICE, "bob", None, None),
    ("-A not led", ALICE, None, "vision", None),
    ("-u self -A any", ALICE, "alice", "physics", ("alice", "physics")),
    ("-A led: every job of it", LEAD, None, "physics", (None, "physics")),
    ("-u other -A led", LEAD, "carol", "physics", ("carol", "physics")),
    ("-u other -A not led", LEAD, "carol", "vision", None),
    ("-u other, no -A, as a lead", LEAD, "carol", None, None),
    ("admin -u other", ADMIN, "carol", None, ("carol", None)),
    ("admin -A any", ADMIN, None, "vision", (None, "vision")),
]


@pytest.mark.parametrize(("case", "v", "user", "account", "expected"), TABLES, ids=[c[0] for c in TABLES])
def test_who_may_list_a_table(case, v, user, account, expected):
    if expected is None:
        with pytest.raises(Denied) as exc:
            table_scope(v, user, account)
        assert exc.value.exit_code == 6 and "[privacy]" in str(exc.value)
    else:
        assert table_scope(v, user, account) == expected
