"""Choose the collector backend: config first, else auto (dcgm if a hostengine answers, else nvml if the
node agent is publishing, else allocation-only). Stdlib only.
"""

from __future__ import annotations

import os

from .agent_files import state_path
from .base import Collector, NoneCollector

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..config import Config


def get_collector(config: Config) -> Collector:
    backend = config.collector.backend
    if backend == "auto":
        from .dcgm_bindings import probe

        if probe(config.dcgm.hostengine, config.dcgm.connect_timeout_s) is None:  # a bounded connect, no bindings
            backend = "dcgm"
        elif os.path.exists(state_path(config.paths.state_dir)):  # the agent publishes (nvml says if it is stale)
            backend = "nvml"
        else:
            return NoneCollector(config, "no GPU collector running on this node (auto: no DCGM, no gpueff agent)")
    if backend == "simulated":
        from .simulated import SimulatedCollector

        return SimulatedCollector(config)
    if backend == "dcgm":
        from .dcgm import DcgmCollector

        return DcgmCollector(config)
    if backend == "nvml":
        from .nvml import NvmlCollector

        return NvmlCollector(config)
    return NoneCollector(config)
