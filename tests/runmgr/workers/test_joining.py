"""A node that joins the run's Ray cluster after the launch's health check (KubeRay's
replacement for an excluded node's pod) on a real local Ray of several raylets
(ray.cluster_utils): it is probed alone first; when it passes it joins the run's
admitted nodes and its room counts, when it fails it stays out with its reason.
The decision's node names map to the Ray nodes' host names (a pod's name on KubeRay)."""

from __future__ import annotations

import socket

import pytest

from health.config import MountSpec
from runmgr.config.schema import RunConfig
from runmgr.nodes import node_name


@pytest.fixture(scope="module")
def ray_nodes():
    """A real local Ray of one raylet (1 CPU) to which the tests add raylets."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


def joining(tmp_path, mounts: list[MountSpec]):
    import ray

    from runmgr.workers.joining import JoiningNodes

    config = RunConfig()
    config.run.dir = str(tmp_path / "run")
    config.cluster.cpus_per_worker = 1
    config.health.storage.mounts = mounts
    said: list[str] = []
    admitted = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
    return JoiningNodes(config, "cpu", admitted, said.append), admitted, said


def test_a_node_that_joins_is_probed_alone_and_admitted_or_turned_away(ray_nodes, tmp_path):
    turned_away, admitted_before, _ = joining(tmp_path / "a", [MountSpec(path=str(tmp_path / "no-such-mount"))])
    held = turned_away.room(())
    ray_nodes.add_node(num_cpus=1)
    ray_nodes.wait_for_nodes()
    assert turned_away.room(()) == held  # the new node lacks the mount: not counted
    (reasons,) = turned_away.turned_away.values()
    assert any("no-such-mount" in reason for reason in reasons), reasons
    assert len(admitted_before) == held

    healthy, admitted, said = joining(tmp_path / "b", [])
    before = healthy.room(())
    ray_nodes.add_node(num_cpus=1)
    ray_nodes.wait_for_nodes()
    assert healthy.room(()) == before + 1
    assert len(admitted) == len(set(admitted)) == before + 1  # the list the worker groups place on
    assert [line for line in said if "joined and was admitted" in line]
    first = admitted[0]
    assert healthy.pod_of(node_name(first)) == socket.gethostname()  # Ray's host name: a pod's name on KubeRay
    assert healthy.pod_of("no-such-node") is None
