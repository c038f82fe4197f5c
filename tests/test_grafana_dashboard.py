"""etc/grafana/gpueff-dashboard.json queries only metrics that exist: every metric name in every panel's
``targets[].expr`` and every template variable's query must be exported by the node agent (collected from
the real agent on the GPU mock, with a job running) or by the service (its collector over a loaded
database). A renamed metric would otherwise leave a panel silently empty.
"""

from __future__ import annotations

import json
import os
import re

import pytest
import synthetic
from fake_gpus import FakeClock, FakeSampler, GiB, hopper, make_config
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from slurm_gpueff import spool
from slurm_gpueff.config import Config
from slurm_gpueff.node.agent import Agent
from slurm_gpueff.service.metrics import registry_for
from slurm_gpueff.service.summarize import summarize_pending
from slurm_gpueff.storage.db import make_engine
from slurm_gpueff.storage.ingest import ingest_spool
from slurm_gpueff.storage.rollups import refresh

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DASHBOARD = os.path.join(ROOT, "etc", "grafana", "gpueff-dashboard.json")
H = "GPU-hhhhhhhh-0000-0000-0000-000000000000"

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
            "unless", "inf", "nan"}
_STRIP = [re.compile(p) for p in (
    r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'',  # strings (label values, regexes)
    r"\{[^{}]*\}",  # label matchers
    r"\[[^\]]*\]",  # range and subquery durations
    r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)",  # label lists
    r"\$\{?\w+\}?",  # Grafana variables
)]
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers that are not functions, keywords or label names."""
    for pattern in _STRIP:
        expr = pattern.sub(" ", expr)
    return {m.group(1) for m in _IDENT.finditer(expr) if not m.group(2) and m.group(1).lower() not in KEYWORDS}


def variable_names(query: str) -> set[str]:
    """``label_values(selector, label)``: the metrics are in the selector, the label is not one."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*\w+\s*\)\s*", query, re.S)
    return metric_names(m.group(1)) if m else metric_names(query)


def dashboard_metrics(dash: dict) -> set[str]:
    names: set[str] = set()

    def walk(panels: list) -> None:
        for p in panels:
            for t in p.get("targets") or []:
                names.update(metric_names(t.get("expr") or ""))
            walk(p.get("panels") or [])  # a collapsed row keeps its panels inside

    walk(dash.get("panels") or [])
    for v in dash.get("templating", {}).get("list", []):
        if v.get("type") == "query":
            q = v.get("query")
            names.update(variable_names(q.get("query", "") if isinstance(q, dict) else str(q or "")))
    return names


def exported(registry: CollectorRegistry) -> set[str]:
    """The names a scrape answers to: samples' names, and an empty family's (a counter's with ``_total``)."""
    names = set()
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        names.add(fam.name + "_total" if fam.type == "counter" else fam.name)
        names.update(s.name for s in fam.samples)
    return names


class _Wrap(Collector):
    def __init__(self, agent: Agent):
        self.agent = agent

    def collect(self):  # noqa: ANN201
        return self.agent.collect()


@pytest.fixture
def agent_names(tmp_path) -> set[str]:
    clock = FakeClock()
    fake = FakeSampler(clock, [hopper(H, 0)])
    # the dashboard's "A user" row needs the per-job series' user label
    agent = Agent(make_config(tmp_path / "node", metrics_per_user=True), fake, wall_clock=clock.wall)
    agent.open()
    fake.set(H, kernel_pct=80.0, memory_used_bytes=4 * GiB, gpm={"sm_active": 40.0, "tensor_active": 5.0,
                                                                   "dram_active": 20.0})
    os.makedirs(os.path.join(agent.state_dir, "jobs"))
    with open(os.path.join(agent.state_dir, "jobs", "42.json"), "w") as fh:
        json.dump({"start": {"uuids": [H]}, "job": {"job_id": 42, "user": "alice", "account": "physics"}}, fh)
    for _ in range(2):
        agent.tick()
        clock.advance(5.0)
    reg = CollectorRegistry()
    reg.register(_Wrap(agent))
    try:
        return exported(reg)
    finally:
        agent.close()


@pytest.fixture
def service_names(tmp_path) -> set[str]:
    cfg = Config({"paths": {"spool_dir": str(tmp_path / "spool"), "state_dir": str(tmp_path / "state"),
                            "database": str(tmp_path / "g.db")},
                  "service": {"metrics_per_user": True}})  # the dashboard's users panel needs the per-user series
    for i in range(6):
        spool.write_record(cfg.paths.spool_dir, synthetic.record(i + 1, gpus=2, timeline_points=3,
                                                                 end=1.70e9 + i * 3600))
    engine = make_engine(cfg.paths.database)
    assert ingest_spool(engine, cfg.paths.spool_dir).ingested == 6
    summarize_pending(engine, cfg.analysis)
    refresh(engine, full=True)
    return exported(registry_for(engine, cfg))


def test_the_extractor_finds_metrics_not_functions_or_labels():
    assert metric_names('sum by (job_id) (rate(gpueff_a_total{user="$user", x=~"a|b"}[$__range])) '
                        '/ on (job_id) group_left (user) gpueff_b offset 5m') == {"gpueff_a_total", "gpueff_b"}
    assert variable_names("label_values(gpueff_job_info{user=\"$user\"}, job_id)") == {"gpueff_job_info"}


def test_every_dashboard_metric_is_exported(agent_names, service_names):
    with open(DASHBOARD) as fh:
        dash = json.load(fh)
    assert 35 <= dash["schemaVersion"] <= 45
    used = dashboard_metrics(dash)
    assert {"gpueff_job_gpu_sm_active_ratio", "gpueff_job_info", "gpueff_gpu_hours_wasted_total"} <= used
    missing = used - agent_names - service_names
    assert not missing, f"the dashboard queries metrics nobody exports: {sorted(missing)}"


def test_every_panel_uses_the_datasource_variable():
    with open(DASHBOARD) as fh:
        dash = json.load(fh)
    rows = [p for p in dash["panels"] if p["type"] == "row"]
    assert [r["title"] for r in rows] == ["A job", "A user", "The site's waste"]
    for p in dash["panels"]:
        if p["type"] != "row":
            assert p["datasource"]["uid"] == "${DS_PROMETHEUS}" and p["targets"], p["title"]
