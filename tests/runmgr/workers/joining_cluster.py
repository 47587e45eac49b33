"""The scenario of test_joining.py in a process of its own (a pytest worker may
hold another Ray connection): a real local Ray of one raylet to which a raylet is
added while two JoiningNodes watch; prints what it saw as one JSON object.

One of the two runs has its device poll and node agents joined as a launch joins them
(:func:`device_poll_beside_agents`), the agents on the nodes the launch admitted (the head):
the node the run admits later holds no rank of the sub-run placed after it joined. Once a
reading of the new node came, chaos's scripted npu-smi reports an uncorrectable ECC error
there only; the readings go through the watcher's device detector and the policy. (The
sub-run is placed after the join, so that the agent's own poll does not run through the
join's health check: about 0.1 CPU-second a reading.)"""

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


POLL_S = 1.0
"""``health.poll_interval_s`` of the run whose device poll runs."""
READ_WITHIN_S = 120.0
"""A safety net: how long the new node's readings may take to show its state (a reading a second)."""


def device_poll_beside_agents(run_dir: Path, admitted: list[str]):
    """The device poll of ``admitted`` (a copy) and the node agents of a run of one one-CPU rank on
    them, joined as a launch joins them (runmgr/wiring.py: the agents tell the poll which nodes
    they hold; tests/runmgr/test_wiring.py checks that link without the launch's imports, about
    7 CPU-seconds here), both reading chaos's scripted npu-smi. (devices, agents, the tools)."""
    from runmgr.chaos.devicetool import DeviceTools
    from runmgr.config.schema import ClusterConfig
    from runmgr.workers.devicepoll import DevicePollGroup, DevicePollSettings
    from runmgr.workers.ray_node_agents import RayNodeAgents

    tools = DeviceTools(run_dir / "tools")
    tools.install()
    path = os.pathsep.join([str(tools.directory), os.environ.get("PATH", "")])
    devices = DevicePollGroup(list(admitted), POLL_S, path=path)
    agents = RayNodeAgents(ClusterConfig(num_workers=1, cpus_per_worker=1), "cpu", start_timeout_s=READ_WITHIN_S,
                           admitted_node_ids=list(admitted), device_poll=DevicePollSettings(POLL_S, path),
                           on_held=devices.cover)
    return devices, agents, tools


def readings_until(devices, node: str, faulty: bool) -> list:
    """The device poll's readings until an ECC reading of ``node`` (a node name) shows the
    state asked for (an uncorrectable error or none); all of them, in the order they came."""
    import time

    seen, deadline = [], time.monotonic() + READ_WITHIN_S
    while time.monotonic() < deadline:
        seen += devices.drain(wait_s=POLL_S)
        if any(r.node == node and r.kind == "ecc" and bool(r.uncorrectable) == faulty for r in seen):
            return seen
    raise AssertionError(f"no ECC reading of {node} with faulty={faulty} within {READ_WITHIN_S} s: {seen[-5:]}")


def ecc_on_rankless_node(devices, tools, joined, node_id: str) -> dict:
    """The new node, which holds no rank, is read mid-run: healthy first, then the ECC error chaos
    switched on for it, an incident naming it, which the policy excludes."""
    from ray._private import ray_constants

    from runmgr.chaos.actions import device_ecc
    from runmgr.config.policy import PolicyConfig
    from runmgr.config.watcher import DeviceConfig
    from runmgr.nodes import node_name
    from runmgr.policy.faults import decide_fault
    from runmgr.policy.history import History
    from runmgr.watch.devices import DeviceDetector

    node = node_name(node_id)
    assert devices.polled == [node_id], f"the node no agent holds has no poller: {devices.polled}"
    healthy = readings_until(devices, node, faulty=False)
    raylet = joined.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid
    device_ecc(tools, node_id, "", raylet)  # chaos's own action: this node's npu-smi only
    readings = healthy + readings_until(devices, node, faulty=True)
    detector = DeviceDetector(DeviceConfig())
    incidents = [i for r in readings for i in detector.update(r, r.time)]
    decisions = [decide_fault(i, History(), PolicyConfig(), []) for i in incidents]
    return {"polled": devices.polled, "read_nodes": sorted({r.node for r in readings}),
            "incidents": [list(i.nodes) for i in incidents],
            "decisions": [[d.action, list(d.exclude_nodes)] for d in decisions]}


def main(root: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from health.config import MountSpec
    from runmgr.cluster import LOCAL_HEAD_PROCESSES, LOCAL_RAY_SYSTEM_CONFIG, keep_local_ray_offline
    from runmgr.nodes import node_name

    # The head a run's own local Ray has (runmgr.cluster.LocalCluster): no autoscaler
    # monitor, no log monitor, no idle workers started ahead of tasks; nothing here needs them.
    keep_local_ray_offline(os.environ)  # tests talk to this machine only
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, **LOCAL_HEAD_PROCESSES, "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)})
    ray._common.utils.reset_ray_address()
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        # Two runs watch the same cluster, one whose mount the new node lacks, one with none:
        # one node joins both (one raylet fewer than a node each), judged by each on its own.
        missing, missing_admitted, _ = joining(root / "a", [MountSpec(path=str(root / "no-such-mount"))])
        polled: list[str] = []
        devices, agents, tools = device_poll_beside_agents(root / "c", [n["NodeID"] for n in ray.nodes()])

        def admit(node_id: str) -> None:
            polled.append(node_id)
            devices.add_node(node_id)

        healthy, admitted, said = joining(root / "b", [], admit)
        before_missing, before = missing.room(()), healthy.room(())
        joined = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        after_missing, after = missing.room(()), healthy.room(())
        try:
            unplaced = devices.polled  # before the sub-run's placement no node is polled, joined or not
            # The sub-run's rank: its agent started, pinned to the head (no rank forked: where the
            # agents are is what the poll follows).
            agents.place(1, ())
            rankless = {"polled_before_placement": unplaced,
                        **ecc_on_rankless_node(devices, tools, joined, joined.node_id),
                        "joined": node_name(joined.node_id), "head": node_name(cluster.head_node.node_id)}
        finally:
            agents.close()
            devices.stop()
        print(json.dumps({
            "rankless": rankless,
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
