"""Live per-GPU gauges of the node agent for Prometheus (``[agent] metrics_port``; 0, the default, = off).

Series are labelled by minor, UUID and model only (never a job id, so they stay bounded); a figure the
agent could not read has no sample, never an invented 0. prometheus_client is imported when the exporter
starts: collectors stay stdlib-only at import time.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from .nvml_sampler import GPM_METRICS

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

    from prometheus_client.metrics_core import Metric

    from .agent import Agent

LABELS = ("minor", "uuid", "model")
ACTIVITIES = ("kernel_active", *GPM_METRICS)  # fractions 0-1 in the agent's ``last`` readings


class AgentCollector:

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def collect(self) -> Iterator[Metric]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        a = self.agent
        act = {m: GaugeMetricFamily(f"gpueff_gpu_{m}_ratio", f"{m.replace('_', ' ')} at the agent's last tick "
                                    "(0-1; GPM metrics on Hopper and newer only)", labels=LABELS)
               for m in ACTIVITIES}
        power = GaugeMetricFamily("gpueff_gpu_power_watts", "Power draw at the last tick", labels=LABELS)
        used = GaugeMetricFamily("gpueff_gpu_memory_used_bytes", "GPU memory in use at the last tick", labels=LABELS)
        total = GaugeMetricFamily("gpueff_gpu_memory_total_bytes", "GPU memory size", labels=LABELS)
        energy = CounterMetricFamily("gpueff_gpu_energy_joules", "Energy since the driver loaded (the agent's "
                                     "estimate between counter reads)", labels=LABELS)
        for g in list(a.gpus.values()):
            info, last = g.info, g.last  # one tick's readings (a new dict each tick)
            labels = [str(info.minor) if info.minor is not None else "", info.uuid, info.model or ""]
            est = g.energy_est_mj()
            readings: list[tuple[GaugeMetricFamily | CounterMetricFamily, float | None]] = [
                *((fam, last.get(m)) for m, fam in act.items()),
                (power, last.get("power_w")), (used, g.memory_used), (total, info.memory_total_bytes),
                (energy, est / 1000.0 if est is not None else None)]
            for fam, v in readings:
                if v is not None:  # an unread figure is a missing series, never 0
                    fam.add_metric(labels, v)
        yield from act.values()
        yield from (power, used, total, energy)
        yield CounterMetricFamily("gpueff_agent_ticks", "Sampling ticks since the agent started", value=a.ticks)
        if a.updated is not None:
            yield GaugeMetricFamily("gpueff_agent_last_tick_timestamp_seconds", "When the last tick ended",
                                    value=a.updated)
        if a.tick_cpu_s is not None:
            yield GaugeMetricFamily("gpueff_agent_tick_cpu_seconds", "CPU time of the last tick", value=a.tick_cpu_s)


def serve(agent: Agent, address: str, port: int) -> tuple[WSGIServer, threading.Thread]:
    """Start the /metrics HTTP server in a daemon thread, with the agent's collector only."""
    from prometheus_client import start_http_server
    from prometheus_client.registry import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(AgentCollector(agent))
    return start_http_server(port, addr=address, registry=reg)
