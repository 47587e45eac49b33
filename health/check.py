"""Run every per-node probe here and fold the results into one
:class:`~health.node.NodeReport`. runmgr decides where this runs (a Ray task
pinned to each node); collectives need several nodes and run separately."""

from __future__ import annotations

import socket
import time
from typing import Callable, Optional

from health.config import HealthConfig
from health.node import NodeReport
from health.probes.compute import probe_compute
from health.probes.data import verify_dataset
from health.probes.devices import probe_devices
from health.probes.software import probe_software
from health.probes.storage import probe_storage


def check_node(config: HealthConfig, node: Optional[str] = None,
               clock: Callable[[], float] = time.time, path: Optional[str] = None
               ) -> NodeReport:
    """Devices, storage, data, software and compute checks of this node.

    ``path`` replaces $PATH when looking up vendor tools (tests, chaos).
    """
    started = clock()
    results = [
        probe_devices(config.devices, path=path),
        probe_storage(config.storage),
        verify_dataset(config.data),
        probe_software(),
        probe_compute(config.compute),
    ]
    return NodeReport.from_probes(node or socket.gethostname(), results, started,
                                  clock() - started)
