"""A local Ray whose head holds no CPU (the driver's pod on KubeRay) and two nodes of
1 CPU, in a process of its own: prints its address, its workers' ids and what
rank_nodes finds, then holds the cluster until stdin closes."""

from __future__ import annotations

import json
import os
import sys


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    from runmgr.cluster import LOCAL_HEAD_PROCESSES, LOCAL_RAY_SYSTEM_CONFIG, keep_local_ray_offline
    from runmgr.config.schema import ClusterConfig
    from runmgr.healthcheck.nodes import rank_nodes

    # The head a run's own local Ray has (runmgr.cluster.LocalCluster): no autoscaler
    # monitor, no log monitor, no idle workers started ahead of tasks; nothing here needs them.
    keep_local_ray_offline(os.environ)  # tests talk to this machine only
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, **LOCAL_HEAD_PROCESSES, "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)})
    ray._common.utils.reset_ray_address()  # no other ray.init() on this machine may join it
    try:
        workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        found = {"one_cpu": sorted(n.node_id for n in rank_nodes(ClusterConfig(cpus_per_worker=1), "cpu")),
                 "no_cpu": len(rank_nodes(ClusterConfig(cpus_per_worker=0), "cpu"))}
        ray.shutdown()
        print(json.dumps({"address": cluster.address, "head": cluster.head_node.node_id,
                          "workers": sorted(node.node_id for node in workers), "rank_nodes": found}), flush=True)
        sys.stdin.read()  # until the test closes it
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the test's commands join with an explicit address
    main()
