"""A four-node Ray cluster on this machine with two broken nodes, for
test_multinode.py. Run as its own process (``python broken_cluster.py DIR``)
so that the Ray it starts and stops never touches the test process's own Ray.

Prints one JSON line (address, node id per role, the HPFS mount spec), then
keeps the cluster up until its stdin closes (the test ended, or died).

Roles: ``head`` and ``spare`` are healthy; ``slow``'s raylet and every worker
it starts are capped to a twentieth of a CPU by a cgroup; ``broken`` carries
the three faults a node finds in itself: its npu-smi reports a double-bit ECC
error, its HPFS directory is missing, and its package metadata says torch
2.12.0. Each of them excludes a node by itself (a report's ``excluded`` lists
failures only, warnings apart), so one node carries all three: two raylets
fewer than a node per fault (each a raylet with its agents, and a probe worker
that imports torch).

Each node stands for a machine of its own (RUNMGR_HOST_ID, see
runmgr/healthcheck/node_task.host_id): nodes that share one host are never
excluded for speed against each other, and the capped node plays a slow
machine among four.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

from runmgr.cluster import LOCAL_HEAD_PROCESSES, LOCAL_RAY_SYSTEM_CONFIG, keep_local_ray_offline
from runmgr.healthcheck.node_task import HOST_ID_ENV
from tests import throttle
from tests.runmgr.healthcheck.fake_ascend import FakeAscend

SLOW_FRACTION = 0.05  # the capped node is ~20x slower idle, ~10x beside two busy loops


@contextmanager
def environment(changes: dict):
    """The raylet started inside inherits these variables, like a real node's own setup."""
    saved = dict(os.environ)
    os.environ.update(changes)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def old_torch_metadata(directory: Path) -> Path:
    """A site directory whose package metadata says torch 2.12.0 (an older stack)."""
    info = directory / "torch-2.12.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.12.0\n")
    return directory


def node_environments(root: Path) -> dict[str, dict[str, str]]:
    healthy = FakeAscend(root / "ascend-ok")
    faulty = FakeAscend(root / "ascend-ecc")
    faulty.set_ecc(1, single=3, double=2)
    roles = {"head": {}, "broken": {"PATH": faulty.path, "PYTHONPATH": str(old_torch_metadata(root / "old-site"))},
             "slow": {}, "spare": {}}
    for role, env in roles.items():  # each node its own directory on the "HPFS" ...
        env.setdefault("PATH", healthy.path)
        env["HPFS_SHARE"] = role
        env[HOST_ID_ENV] = f"machine-{role}"
        (root / "hpfs" / role).mkdir(parents=True)
    (root / "hpfs" / "broken").rmdir()  # ... and the broken node's is gone
    return roles


def main(root: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    roles = node_environments(root)
    with environment(roles["head"]):
        # The head a run's own local Ray has (runmgr.cluster.LocalCluster): no autoscaler monitor,
        # no log monitor; the health check reads its probes' results, not their workers' logs.
        keep_local_ray_offline(os.environ)  # tests talk to this machine only
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, **LOCAL_HEAD_PROCESSES,
                                                                 "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)})
    ray._common.utils.reset_ray_address()  # no other ray.init() on this machine may join it
    try:
        nodes = {"head": cluster.head_node}
        for role, env in list(roles.items())[1:]:
            with environment(env):
                nodes[role] = cluster.add_node(num_cpus=1)
        with throttle.CpuThrottle(f"runmgr-test-{os.getpid()}", SLOW_FRACTION) as cap:
            cap.add_tree(nodes["slow"].all_processes["raylet"][0].process.pid)
            # One disk and two cores for four nodes: no throughput floor for the "HPFS".
            spec = (f"[{{path: '{root}/hpfs/$HPFS_SHARE', min_free_gb: 0, min_write_mbps: 0, "
                    "min_read_mbps: 0, max_latency_ms: 10000}]")
            print(json.dumps({"address": cluster.address, "mount_spec": spec,
                              "ids": {role: node.node_id for role, node in nodes.items()}}), flush=True)
            sys.stdin.read()  # until the test closes it
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    os.environ["RAY_AUTH_MODE"] = "disabled"  # the test's commands join with an explicit address
    main(Path(sys.argv[1]))
