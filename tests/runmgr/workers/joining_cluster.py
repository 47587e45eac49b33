"""The scenario of test_joining.py in a process of its own (a pytest worker may
hold another Ray connection): a real local Ray of one raylet to which a raylet is
added while two JoiningNodes watch; prints what it saw as one JSON object."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path


def joining(run_dir: Path, mounts: list, on_admitted=lambda node_id: None):
    import ray

    from runmgr.config.schema import RunConfig
    from runmgr.workers.joining import JoiningNodes

    config = RunConfig()
    config.run.dir = str(run_dir)
    config.cluster.cpus_per_worker = 1
    config.health.storage.mounts = mounts
    # Small benchmarks: what is checked is whether the joined node is probed and admitted, not its figures.
    config.health.compute.matmul_size, config.health.compute.bandwidth_mb = 256, 8.0
    said: list[str] = []
    admitted = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    return JoiningNodes(config, "cpu", admitted, said.append, on_admitted), admitted, said


def main(root: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from health.config import MountSpec
    from runmgr.cluster import LOCAL_HEAD_PROCESSES, LOCAL_RAY_SYSTEM_CONFIG
    from runmgr.nodes import node_name

    # The head a run's own local Ray has (runmgr.cluster.LocalCluster): no autoscaler
    # monitor, no log monitor, no idle workers started ahead of tasks; nothing here needs them.
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, **LOCAL_HEAD_PROCESSES, "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)})
    ray._common.utils.reset_ray_address()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        # Two runs watch the same cluster, one whose mount the new node lacks, one with none:
        # one node joins both (one raylet fewer than a node each), judged by each on its own.
        missing, missing_admitted, _ = joining(root / "a", [MountSpec(path=str(root / "no-such-mount"))])
        polled: list[str] = []
        healthy, admitted, said = joining(root / "b", [], polled.append)
        before_missing, before = missing.room(()), healthy.room(())
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        after_missing, after = missing.room(()), healthy.room(())
        print(json.dumps({
            "missing": {"before": before_missing, "after": after_missing, "admitted": len(missing_admitted),
                        "turned_away": list(missing.turned_away.values())},
            "healthy": {"before": before, "after": after, "admitted": admitted, "said": said, "polled": polled},
            "pod_of_first": healthy.pod_of(node_name(admitted[0])), "pod_of_unknown": healthy.pod_of("no-such-node"),
            "hostname": socket.gethostname()}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    os.environ["RAY_AUTH_MODE"] = "disabled"
    main(Path(sys.argv[1]))
