"""The scenarios of test_node_agent_devices.py in a process of its own (the session's local Ray
has no accelerators, and one process holds one Ray connection): a real local Ray that
advertises 3 GPUs and 2 NPUs it does not have. Ray assigns their ids and sets the
visible-devices variables as on a real node. On the NPUs, a sub-run of 2 ranks of one device
each is started under real node agents (runmgr/workers/node_agent.py) through the agent group;
each forked rank raises, before it trains, with the visible-devices variables it sees
(:func:`say_what_it_sees`), and its error comes back through the agent's push as a launch's
would. On the GPUs a warm sub-run (:func:`run_warm`): 2 ranks and a spare, rank 1 killed,
the spare named rank 1, a new spare forked in the slot it left, and one more refused; each
process writes what it sees to a file of its pid (:class:`RecordWhatItSees`) and waits. Prints
what was seen as one JSON object."""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

VARIABLES = ("CUDA_VISIBLE_DEVICES", "ASCEND_RT_VISIBLE_DEVICES")
SEEN = "sees"
DEVICES = {"GPU": 3, "NPU": 2}
"""Of each kind, on the one local node: the warm sub-run's 2 ranks and a spare hold the 3 GPUs."""
WARM_WAIT_S = 120.0
"""How long the warm sub-run's processes may take to be forked and say what they see."""


def say_what_it_sees(reporter, plan):
    """A rank's wrap (applied in the forked rank, before it trains): its error names its
    visible-devices variables, as ``sees CUDA_VISIBLE_DEVICES=1 ASCEND_RT_VISIBLE_DEVICES=-``."""
    raise RuntimeError(SEEN + " " + " ".join(f"{name}={os.environ.get(name, '-')}" for name in VARIABLES))


@dataclass(frozen=True)
class RecordWhatItSees:
    """A rank's or spare's wrap (applied in the forked process, before it trains or builds):
    writes ``<pid>.json``, its visible-devices variables, into ``out``, then waits until its
    agent ends it, holding its devices the while (it need not train: no device is here)."""

    out: str

    def __call__(self, reporter, plan):
        seen = {name: os.environ.get(name, "-") for name in VARIABLES}
        target = Path(self.out) / f"{os.getpid()}.json"
        target.with_suffix(".tmp").write_text(json.dumps(seen))
        target.with_suffix(".tmp").rename(target)  # whole, or not there
        threading.Event().wait()


def recorded(out: Path, count: int) -> dict[int, str]:
    """``{pid: CUDA_VISIBLE_DEVICES}`` once ``count`` processes wrote what they see."""
    deadline = time.monotonic() + WARM_WAIT_S
    while len(files := list(out.glob("*.json"))) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return {int(path.stem): json.loads(path.read_text())["CUDA_VISIBLE_DEVICES"] for path in files}


def reservations() -> list[dict]:
    """The placement groups not removed: ``{"state", "bundles", "nodes"}`` each (bundles by index,
    the node id each sits on)."""
    from ray.util.placement_group import placement_group_table

    return [{"state": pg["state"], "bundles": list(pg["bundles"].values()),
             "nodes": list(pg["bundles_to_node_id"].values())}
            for pg in placement_group_table().values() if pg["state"] != "REMOVED"]


def run_warm(save: Path) -> dict:
    """A warm sub-run on the GPUs, driven as runmgr/workers/warm_agents.py drives it: 2 ranks and a
    spare forked under the one agent, rank 1 killed, the spare renamed rank 1 (``regroup``), a new
    spare forked in the slot rank 1 left (the refill), then one more asked for."""
    import ray

    from runmgr.agents.device_slices import NoFreeDevices
    from runmgr.agents.warm_link import WarmRun
    from runmgr.config.schema import ClusterConfig
    from runmgr.workers.agent_group import AgentWorkerGroup
    from runmgr.workers.ray_node_agents import RayNodeAgents
    from tests.runmgr.agents.configs import tiny_config
    from tests.runmgr.workers.devices_cluster import RecordWhatItSees
    from trainer.plan import ResumePlan

    out = save / "seen"
    out.mkdir(parents=True)
    nodes = RayNodeAgents(ClusterConfig(num_workers=2, cpus_per_worker=0.5, devices_per_worker=1), "cuda",
                          start_timeout_s=60, push_interval_s=0.2)
    nodes.wrap_reporter = RecordWhatItSees(str(out))
    group = AgentWorkerGroup(nodes, default_world=2)
    try:
        workers = group.start(tiny_config(save, 3, save_interval=3), ResumePlan(subrun="1.00"), extra=1,
                              warm=lambda rank_nodes: WarmRun(1, True))
        (place,) = group.places
        held = ray.get(place.where.held.remote())
        groups = reservations()
        (spare,) = nodes.start_spares(place, 1, 1)
        before = recorded(out, 3)
        group.kill(1)
        (adopted,) = nodes.collect([nodes.regroup(place, "1.01", {spare: 1}, {}, None)])
        nodes.start_spares(place, 1, 1)
        after = recorded(out, 4)
        try:
            nodes.start_spares(place, 1, 1)
            refused = ""
        except NoFreeDevices as exc:
            refused = str(exc)
    finally:
        group.shutdown()
        nodes.close()
    return {"ranks": {w.rank: w.pid for w in workers}, "spare_pid": adopted[0].pid, "adopted_rank": adopted[0].rank,
            "before": before, "after": after, "refused": refused, "held": held, "groups": groups,
            "groups_after": reservations()}


def run_kind(kind: str, save: Path) -> dict:
    import ray

    from runmgr.config.schema import ClusterConfig
    from runmgr.workers.agent_group import AgentWorkerGroup
    from runmgr.workers.ray_node_agents import RayNodeAgents
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
        groups = reservations()
        failures, deadline = [], time.monotonic() + 120
        while len(failures) < 2 and time.monotonic() < deadline:
            failures += group.poll(0.5).failures
    finally:
        group.shutdown()
        nodes.close()
    return {"workers": [[w.rank, w.pid] for w in workers], "held": held, "groups": groups,
            "groups_after": reservations(),
            "failures": [[f.rank, f.kind, f.text] for f in failures]}


def main(root: Path) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from runmgr.cluster import LOCAL_HEAD_PROCESSES, LOCAL_RAY_SYSTEM_CONFIG, keep_local_ray_offline

    # The head a run's own local Ray has (runmgr.cluster.LocalCluster: no autoscaler monitor, no
    # log monitor), advertising devices it does not have.
    keep_local_ray_offline(os.environ)  # tests talk to this machine only
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 2, "num_gpus": DEVICES["GPU"], "resources": {"NPU": DEVICES["NPU"]}, **LOCAL_HEAD_PROCESSES,
        "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)})
    ray._common.utils.reset_ray_address()  # no other ray.init() on this machine may join it
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.ERROR)
    try:
        # One agent (a Ray worker and its fork server) per scenario: the GPUs' is the warm one.
        seen = {"npu": run_kind("npu", root / "npu"), "warm": run_warm(root / "warm"),
                "node": ray.get_runtime_context().get_node_id()}  # the one node
        print(json.dumps(seen), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    os.environ["RAY_AUTH_MODE"] = "disabled"
    main(Path(sys.argv[1]))
