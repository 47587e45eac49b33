"""The scenario of test_node_agent_devices.py in a process of its own (the session's local Ray
has no accelerators, and one process holds one Ray connection): a real local Ray that
advertises 2 GPUs and 2 NPUs it does not have. Ray assigns their ids and sets the
visible-devices variables as on a real node. For each kind, a sub-run of 2 ranks of one device
each is started under real node agents (runmgr/workers/node_agent.py) through the agent group;
each forked rank raises, before it trains, with the visible-devices variables it sees
(:func:`say_what_it_sees`), and its error comes back through the agent's push as a launch's
would. Prints what was seen as one JSON object."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path

VARIABLES = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
SEEN = "sees"
DEVICES = 2
"""Of each kind, on the one local node."""


def say_what_it_sees(reporter, plan):
    """A rank's wrap (applied in the forked rank, before it trains): its error names its
    visible-devices variables, as ``sees CUDA_VISIBLE_DEVICES=1 ASCEND_RT_VISIBLE_DEVICES=-``."""
    raise RuntimeError(SEEN + " " + " ".join(f"{name}={os.environ.get(name, '-')}" for name in VARIABLES))


def run_kind(kind: str, save: Path) -> dict:
    import ray
    from ray.util.placement_group import placement_group_table

    from runmgr.config.schema import ClusterConfig
    from runmgr.workers.agent_group import AgentWorkerGroup
    from runmgr.workers.node_agent import RayNodeAgents
    from tests.runmgr.agents.configs import tiny_config
    from trainer.plan import ResumePlan

    nodes = RayNodeAgents(ClusterConfig(num_workers=2, cpus_per_worker=0.5, devices_per_worker=1), kind,
                          start_timeout_s=60, push_interval_s=0.2)
    # By its module's name: the agents could not unpickle this script's ``__main__.say_what_it_sees``.
    from tests.runmgr.workers.devices_cluster import say_what_it_sees as wrap

    nodes.wrap_reporter = wrap
    group = AgentWorkerGroup(nodes, default_world=2)
    try:
        workers = group.start(tiny_config(save, 3, save_interval=3), ResumePlan(subrun="1.00"))
        held = [ray.get(place.where.held.remote()) for place in nodes.place(2, ())]
        groups_left = [pg for pg in placement_group_table().values() if pg["state"] != "REMOVED"]
        failures, deadline = [], time.monotonic() + 120
        while len(failures) < 2 and time.monotonic() < deadline:
            failures += group.poll(0.5).failures
    finally:
        group.shutdown()
        nodes.close()
    return {"workers": [[w.rank, w.pid] for w in workers], "held": held, "groups_left": len(groups_left),
            "failures": [[f.rank, f.kind, f.text] for f in failures]}


def main(root: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from runmgr.cluster import LOCAL_HEAD_PROCESSES, LOCAL_RAY_SYSTEM_CONFIG

    # The head a run's own local Ray has (runmgr.cluster.LocalCluster: no autoscaler monitor, no
    # log monitor), advertising devices it does not have.
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "num_gpus": DEVICES, "resources": {"NPU": DEVICES}, **LOCAL_HEAD_PROCESSES,
        "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)})
    ray._common.utils.reset_ray_address()  # no other ray.init() on this machine may join it
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        seen = {kind: run_kind(kind, root / kind) for kind in ("cuda", "npu")}
        print(json.dumps(seen), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    os.environ["RAY_AUTH_MODE"] = "disabled"
    main(Path(sys.argv[1]))
