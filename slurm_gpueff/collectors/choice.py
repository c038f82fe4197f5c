"""Which backend measures a job: the configured one, or with ``auto`` the best this node has; and a backend
by name, for a running job's live records (they use the one its Prolog used).

Apart from :mod:`.base` (what every backend is) because choosing needs the backends themselves, which are
built on base. Stdlib only at import time: a backend's module is imported only when it is chosen.
"""

from __future__ import annotations

import os

from .base import Collector, NoneCollector

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..config import Config


def get_collector(config: Config) -> Collector:
    """The configured backend, or with "auto": dcgm if a hostengine answers, else nvml if the node agent is
    publishing, else allocation-only."""
    backend = config.collector.backend
    if backend == "auto":
        from .. import statedir
        from .dcgm_bindings import probe

        if probe(config.dcgm.hostengine, config.dcgm.connect_timeout_s) is None:  # a bounded connect, no bindings
            backend = "dcgm"
        elif os.path.exists(statedir.agent_state(config.paths.state_dir)):  # the agent publishes (nvml: is it stale)
            backend = "nvml"
        else:
            return NoneCollector(config, "no GPU collector running on this node (auto: no DCGM, no gpueff agent)")
    return named_collector(config, backend)


def named_collector(config: Config, backend: str) -> Collector:
    """The collector of one backend by name (a running job's live records use the one its Prolog used)."""
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
