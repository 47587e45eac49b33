"""What the launch's builders start (runmgr/wiring.py), checked without a cluster: the mid-run
device poll runs where there is an accelerator to read, or chaos scripts one, and not for
ranks on CPU, where it would only cost a Ray worker per node and one beside the driver. The
built-in trainer's ranks run under node agents, warm or not, on every device kind, and are read
by their agents (the poll folded into the agent: no poller actor beside them), while the admitted
nodes no agent holds get a poller each, following each sub-run's placement. A Megatron job's node
actors read their nodes' devices as the agents do, and tell the poll which nodes they hold."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.chaos.build import Chaos
from runmgr.config.compose import load_run_config
from runmgr.errors import ClusterError
from runmgr.nodes import node_name
from runmgr.wiring import build_runner, start_device_poll
from runmgr.workers import megatron_nodes, ray_node_agents
from runmgr.workers.devicepoll import DevicePollGroup, DevicePollSettings

WARM = ("controller.warm_spares=1", "checkpoint.memory_interval=1")


@pytest.fixture
def started(monkeypatch) -> list[DevicePollGroup]:
    """The device poll groups whose pollers were started (no Ray: the start is only counted)."""
    groups: list[DevicePollGroup] = []
    monkeypatch.setattr(DevicePollGroup, "start", lambda self: groups.append(self))
    return groups


def config(tmp_path: Path, *overrides: str, chaos: str = "none"):
    return load_run_config("demo", [f"run.dir={tmp_path}", f"chaos={chaos}", "cluster.local_nodes=1", *overrides])


def agents_poll(run_config, chaos, device_kind: str):
    """How the runner's node agents read their nodes' devices (None: they do not)."""
    runner = build_runner(run_config, run_config.trainer_config(), device_kind, None, chaos)
    return runner.make_group().agents.device_poll


@pytest.mark.parametrize("device_kind", ["cuda", "npu"])
def test_an_accelerator_run_under_agents_has_its_agents_read_their_devices_and_no_poller(tmp_path, started,
                                                                                      device_kind):
    run_config = config(tmp_path)
    devices = start_device_poll(run_config, None, ["n1", "n2"], device_kind)
    assert started == [] and devices.drain() == []
    assert agents_poll(run_config, None, device_kind) == DevicePollSettings(run_config.health.poll_interval_s)


@pytest.mark.parametrize("device_kind", ["cuda", "npu"])
def test_a_warm_accelerator_run_is_under_agents_that_read_their_devices_with_no_poller(tmp_path, started,
                                                                                   device_kind):
    # Warm spares on accelerators are forked under the agents too (each with devices of its own):
    # no rank actor is left to poll beside them.
    run_config = config(tmp_path, *WARM)
    devices = start_device_poll(run_config, None, ["n1", "n2"], device_kind)
    assert started == [] and devices.drain() == []
    runner = build_runner(run_config, run_config.trainer_config(), device_kind, None, None)
    assert runner.make_group().ranks.agents.device_poll == DevicePollSettings(run_config.health.poll_interval_s)


def megatron_nodes_of(run_config, chaos, device_kind: str, devices=None) -> megatron_nodes.MegatronNodes:
    """The node actors of the runner's Megatron group (placed only when a sub-run starts)."""
    return build_runner(run_config, run_config.trainer_config(), device_kind, None, chaos, devices).make_group().nodes


@pytest.mark.parametrize("device_kind", ["cuda", "npu"])
def test_a_megatron_job_on_accelerators_has_its_node_actors_read_their_devices_and_no_poller(tmp_path, started,
                                                                                         device_kind):
    run_config = config(tmp_path, "trainer.kind=megatron")
    devices = start_device_poll(run_config, None, ["n1", "n2"], device_kind)
    assert started == [] and devices.drain() == []
    nodes = megatron_nodes_of(run_config, None, device_kind, devices)
    assert nodes.device_poll == DevicePollSettings(run_config.health.poll_interval_s)
    assert nodes.on_held == devices.cover


def test_a_cpu_run_starts_no_poller_and_reads_nothing(tmp_path, started):
    run_config = config(tmp_path)
    devices = start_device_poll(run_config, None, ["n1"], "cpu")
    assert started == []
    assert devices.drain() == []
    devices.add_node("n2")  # a replacement node: still nothing to start
    devices.stop()
    assert started == []
    assert agents_poll(run_config, None, "cpu") is None
    runner = build_runner(run_config, run_config.trainer_config(), "cpu", None, None, devices)
    assert runner.make_group().agents.on_held is None  # no poll to tell where the agents are


def test_a_cpu_run_whose_chaos_scripts_the_device_tools_has_its_agents_poll_them(tmp_path, started):
    run_config = config(tmp_path, chaos="opt_run12")  # its ECC fault writes an npu-smi that reports it
    chaos = Chaos(run_config, tmp_path)
    assert start_device_poll(run_config, chaos, ["n1"], "cpu") and started == []
    settings = agents_poll(run_config, chaos, "cpu")
    assert settings is not None and settings.path is not None and settings.path.startswith(str(chaos.tools_dir))


@pytest.mark.parametrize("device_kind", ["cpu", "cuda"])
def test_a_warm_run_whose_chaos_scripts_the_device_tools_has_its_agents_poll_them(tmp_path, started, device_kind):
    # Warm spares run under the node agents (runmgr/workers/warm_agents.py) on every device kind:
    # their agents read the scripted tools, as without spares, and no poller starts.
    run_config = config(tmp_path, *WARM, chaos="opt_run12")
    chaos = Chaos(run_config, tmp_path)
    assert start_device_poll(run_config, chaos, ["n1"], device_kind) and started == []
    runner = build_runner(run_config, run_config.trainer_config(), device_kind, None, chaos)
    settings = runner.make_group().ranks.agents.device_poll
    assert settings is not None and settings.path is not None and settings.path.startswith(str(chaos.tools_dir))


def test_a_megatron_job_whose_chaos_scripts_the_device_tools_has_its_node_actors_read_them(tmp_path, started):
    # A Megatron job's node actors read the scripted tools as the agents do; the pollers of the
    # nodes none of them holds read the same tools.
    run_config = config(tmp_path, "trainer.kind=megatron", chaos="opt_run12")
    chaos = Chaos(run_config, tmp_path)
    devices = start_device_poll(run_config, chaos, ["n1"], "cpu")
    assert started == [] and devices.path is not None and devices.path.startswith(str(chaos.tools_dir))
    settings = megatron_nodes_of(run_config, chaos, "cpu", devices).device_poll
    assert settings is not None and settings.path == devices.path


N1, N2, N3, N4 = (str(i) * 56 for i in range(1, 5))
"""Ray node ids (hex, as Ray's scheduling wants them); a plan avoids nodes by their names."""


class Cluster:
    """Where Ray would put a placement's agents and pollers, recorded in order, without Ray: the
    next placement's nodes (one rank's bundle on each), or a ClusterError for the next one."""

    def __init__(self, monkeypatch) -> None:
        self.log: list[tuple[str, str]] = []
        self.next: list[str] | ClusterError = []
        monkeypatch.setattr(DevicePollGroup, "_poller_on", lambda group, node: self.record("poller", node))
        monkeypatch.setattr(DevicePollGroup, "_end", lambda group, poller: self.record("poller ends", poller))
        monkeypatch.setattr(DevicePollGroup, "_wait_ready", lambda group, pollers: None)
        monkeypatch.setattr(ray_node_agents, "place", self.place)
        monkeypatch.setattr(ray_node_agents, "node_of", lambda strategy: strategy)
        monkeypatch.setattr(ray_node_agents, "release", lambda pg: None)
        monkeypatch.setattr(ray_node_agents, "reserve_nodes", self.reserve)
        monkeypatch.setattr(ray_node_agents, "RemoteNodeAgent", self)
        monkeypatch.setattr(ray_node_agents.ray, "kill", lambda agent, no_restart: self.record("agent ends", agent))

    def record(self, what: str, node: str) -> str:
        self.log.append((what, node))
        return node

    def place(self, bundle, count, what, strategy, timeout_s, admitted, avoid):
        if isinstance(self.next, ClusterError):
            raise self.next
        assert count == len(self.next) and not {node_name(node) for node in self.next} & set(avoid)
        return None, list(self.next)

    def reserve(self, counts, bundle, timeout_s, replacing):
        self._reserved = list(counts)  # a bundle per node, in this order
        return "reservation"

    def options(self, scheduling_strategy, **resources):
        self._node = self._reserved[scheduling_strategy.placement_group_bundle_index]
        return self

    def remote(self, *args):
        return self.record("agent", self._node)


def test_the_pollers_follow_the_nodes_the_agents_of_each_sub_run_hold(tmp_path, monkeypatch):
    # The lineage's own wiring (runmgr/lineage.py drive): the device poll over the admitted nodes,
    # told by the runner's node agents which nodes each placement holds. Scripted device tools
    # (chaos's ECC fault) make a CPU run poll.
    cluster = Cluster(monkeypatch)
    run_config = config(tmp_path, chaos="opt_run12")
    chaos = Chaos(run_config, tmp_path)
    devices = start_device_poll(run_config, chaos, [N1, N2, N3], "cpu")
    agents = build_runner(run_config, run_config.trainer_config(), "cpu", [N1, N2, N3], chaos,
                          devices).make_group().agents
    assert agents.on_held == devices.cover
    assert cluster.log == []  # before the first placement nothing is polled (it comes within seconds)

    cluster.next = [N1, N2]  # sub-run 1: the two ranks on N1 and N2; N3 is held in reserve
    agents.place(2, ())
    assert cluster.log == [("poller", N3), ("agent", N1), ("agent", N2)] and devices.polled == [N3]

    cluster.log.clear()  # N2 excluded: sub-run 2 on N1 and N3
    cluster.next = [N1, N3]
    agents.place(2, (node_name(N2),))
    # N3's poller ends before its agent starts (the node is not read twice), and the freed N2 is read.
    assert cluster.log == [("agent ends", N1), ("agent ends", N2), ("poller ends", N3), ("poller", N2),
                           ("agent", N1), ("agent", N3)]
    assert devices.polled == [N2]

    devices.add_node(N4)  # KubeRay's replacement for N2 joins while sub-run 2 runs: no agent holds it
    devices.add_node(N4)
    assert devices.polled == [N2, N4]

    cluster.log.clear()  # N1 excluded too, and the next placement fails: no agent reads a node until one succeeds
    cluster.next = ClusterError("too few nodes")
    with pytest.raises(ClusterError):
        agents.place(2, (node_name(N2), node_name(N1)))
    assert cluster.log == [("agent ends", N1), ("agent ends", N3), ("poller", N1), ("poller", N3)]
    assert sorted(devices.polled) == [N1, N2, N3, N4]
    assert devices.node_ids == [N1, N2, N3, N4]


class MegatronCluster(Cluster):
    """Where Ray would put a Megatron job's node actors and the pollers, recorded in order."""

    def __init__(self, monkeypatch) -> None:
        super().__init__(monkeypatch)
        self.started: list[dict] = []
        """Each node actor's keyword arguments (its device poll, the node its readings name)."""
        monkeypatch.setattr(megatron_nodes, "place", self.place)
        monkeypatch.setattr(megatron_nodes, "node_of", lambda strategy: strategy)
        monkeypatch.setattr(megatron_nodes, "release", lambda pg: None)
        monkeypatch.setattr(megatron_nodes, "RemoteMegatronNode", self)
        monkeypatch.setattr(megatron_nodes.ray, "kill", lambda actor, no_restart: self.record("node actor ends",
                                                                                              actor.node))
        monkeypatch.setattr(megatron_nodes.ray_cluster, "get_while_head_lives",
                            lambda refs, timeout_s: [{"node_id": ref} for ref in refs])

    def options(self, scheduling_strategy, **resources):
        self._node = scheduling_strategy  # node_of: the strategy stands for its node
        return self

    def remote(self, *args, **kwargs):
        self.started.append(kwargs)
        return NodeActor(self.record("node actor", self._node))


class NodeActor:
    """A node actor's handle: ``describe`` answers its node."""

    def __init__(self, node: str) -> None:
        self.node = node
        self.describe = type("Method", (), {"remote": staticmethod(lambda: node)})


def test_a_megatron_jobs_pollers_run_only_on_the_admitted_nodes_no_node_actor_holds(tmp_path, monkeypatch):
    # As the agents do (above): each placement's node actors are told to the poll before they
    # start, and read their nodes themselves (chaos's scripted tools here, on CPU).
    cluster = MegatronCluster(monkeypatch)
    run_config = config(tmp_path, "trainer.kind=megatron", chaos="opt_run12")
    chaos = Chaos(run_config, tmp_path)
    devices = start_device_poll(run_config, chaos, [N1, N2, N3], "cpu")
    nodes = megatron_nodes_of(run_config, chaos, "cpu", devices)
    assert cluster.log == []  # before the first placement nothing is polled

    cluster.next = [N1, N2]  # sub-run 1 on N1 and N2; N3 is held in reserve
    nodes.for_subrun(2, ())
    assert cluster.log == [("poller", N3), ("node actor", N1), ("node actor", N2)] and devices.polled == [N3]
    assert [(kw["node"], kw["device_poll"].path) for kw in cluster.started] == [
        (node_name(N1), devices.path), (node_name(N2), devices.path)]

    cluster.log.clear()  # N2 excluded: sub-run 2 on N1 and N3; N3's poller ends before its node actor starts
    cluster.next = [N1, N3]
    nodes.for_subrun(2, (node_name(N2),))
    assert cluster.log == [("node actor ends", N1), ("node actor ends", N2), ("poller ends", N3), ("poller", N2),
                           ("node actor", N1), ("node actor", N3)]
    assert devices.polled == [N2]

    cluster.log.clear()  # N1 excluded too, and the placement fails: every admitted node is polled
    cluster.next = ClusterError("too few nodes")
    with pytest.raises(ClusterError):
        nodes.for_subrun(2, (node_name(N2), node_name(N1)))
    assert cluster.log == [("node actor ends", N1), ("node actor ends", N3), ("poller", N1), ("poller", N3)]
    assert sorted(devices.polled) == [N1, N2, N3]
