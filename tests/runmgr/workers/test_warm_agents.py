"""The warm group on node agents (runmgr/workers/warm_agents.py), stepped in-process: fake
ranks and agents record what the group asks and play back what agents push. A recovery asks
each node once (who waits, then who becomes which rank and where the group re-forms), never
each rank, and so does the lost-node probe at each poll while a peer waits; spares are counted
ready only once their agent says so, given up when they are not ready within the start timeout
(on a fake clock), and a used one is refilled in the slot the lost rank left once the re-formed
group stepped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from runmgr.agents.device_slices import NoFreeDevices
from runmgr.agents.report import SpareNews
from runmgr.agents.snapshots import HELD, HeldSnapshot
from runmgr.agents.warm_link import WarmRun
from runmgr.controller.group import GroupPoll, WarmRecoveryError, WarmStart, WorkerInfo
from runmgr.workers import liveness, warm_agents
from runmgr.workers.agent_group import NodePlace
from runmgr.workers.agent_spares import AgentSparePool
from runmgr.workers.liveness import PeerProbe, ProbeResult
from runmgr.workers.ray_node_agents import spares_with_room
from runmgr.workers.warm_agents import WarmAgentGroup
from tests.runmgr.agents.configs import tiny_config
from tests.runmgr.workers.probe_fakes import Call, FakeAnswers, FakeClock
from trainer.plan import ResumePlan
from trainer.report import StepReport

NODE_A, NODE_B = "a" * 40, "b" * 40
"""Two node ids; their names (runmgr/nodes.py) are their first characters."""


def name(node_id: str) -> str:
    from runmgr.nodes import node_name

    return node_name(node_id)


def step_report(step: int, subrun: str = "1.00") -> StepReport:
    return StepReport(subrun, step, 2.0, 1.0, 1e-3, 1.0, 512, step * 8, 0.1, (), False, 1000.0 + step)


@dataclass
class FakeRanks:
    """The agent group the warm group holds: two nodes, ranks 0-1 on A, 2-3 on B, a spare on B."""

    polls: list[GroupPoll] = field(default_factory=list)
    side: list[tuple[str, object]] = field(default_factory=list)
    killed: list[int] = field(default_factory=list)
    lost: list[int] = field(default_factory=list)
    adopted: list[tuple[WorkerInfo, str]] = field(default_factory=list)
    subrun: str = "1.00"
    warm: Optional[WarmRun] = None
    side_kinds: frozenset = frozenset()
    start_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        self.places = [NodePlace(name(NODE_A), (0, 1), "agent-a"), NodePlace(name(NODE_B), (2, 3), "agent-b", spares=1)]
        self._place_of = {rank: place for place in self.places for rank in place.ranks}
        self.infos = [WorkerInfo(rank, 100 + rank, NODE_A if rank < 2 else NODE_B, "127.0.0.1") for rank in range(4)]

    @property
    def workers(self) -> list[WorkerInfo]:
        return list(self.infos)

    @property
    def world_size(self) -> int:
        return len(self.infos)

    def start(self, config, plan, extra: int = 0, warm=None) -> list[WorkerInfo]:
        assert extra == 1
        self.warm = warm({rank: place.node for rank, place in self._place_of.items()})
        return self.workers

    def place_of(self, rank: int) -> NodePlace:
        return self._place_of[rank]

    def poll(self, timeout_s: float) -> GroupPoll:
        return self.polls.pop(0) if self.polls else GroupPoll()

    def take_side_items(self) -> list[tuple[str, object]]:
        items, self.side = self.side, []
        assert all(kind in self.side_kinds for kind, _ in items)
        return items

    def kill(self, rank: int) -> None:
        self.killed.append(rank)

    def adopt(self, info: WorkerInfo, place: NodePlace) -> None:
        self.infos[info.rank] = info
        self._place_of[info.rank] = place
        self.adopted.append((info, place.node))

    def regrouped(self, subrun: str) -> None:
        self.subrun = subrun

    @property
    def running(self) -> set[int]:
        return {rank for rank in range(len(self.infos)) if rank not in self.lost}

    def lose(self, rank: int) -> None:
        self.lost.append(rank)

    def shutdown(self) -> None:
        pass


@dataclass
class FakeAgents:
    """The node agents: every call recorded, by node."""

    waiting_ranks: set[int] = field(default_factory=set)
    calls: list[tuple[str, str]] = field(default_factory=list)
    gone: set[str] = field(default_factory=set)
    """Nodes whose agent answers no probe."""
    probes: list[str] = field(default_factory=list)
    killed: list[tuple[str, int]] = field(default_factory=list)
    regroups: dict[str, tuple] = field(default_factory=dict)
    started: list[tuple[str, int, int]] = field(default_factory=list)

    def rendezvous(self, place: NodePlace) -> tuple[str, int]:
        self.calls.append(("rendezvous", place.node))
        return "10.0.0.1", 29500

    def start_spares(self, place: NodePlace, count: int, buddy_offset: int) -> list[int]:
        self.started.append((place.node, count, buddy_offset))
        return [-1 - index for index in range(len(self.started) - 1, len(self.started) - 1 + count)]

    def waiting(self, places) -> set[int]:
        self.calls += [("waiting", place.node) for place in places]
        return set(self.waiting_ranks)

    def regroup(self, place: NodePlace, subrun: str, named: dict[int, int], answers: dict[int, Any], rank_nodes):
        self.calls.append(("regroup", place.node))
        self.regroups[place.node] = (subrun, named, answers, rank_nodes)
        return [WorkerInfo(rank, 900 + rank, NODE_B, "127.0.0.2") for rank in named.values()]

    def collect(self, calls: list) -> list:
        return calls

    def probe(self, place: NodePlace) -> Call:
        self.probes.append(place.node)
        return Call(place.node, None if place.node in self.gone else sorted(self.waiting_ranks))

    def kill_rank(self, place: NodePlace, rank: int) -> None:
        self.killed.append((place.node, rank))


@dataclass
class FakeProbe:
    """The lost-node probe (runmgr/workers/liveness.py), its answers played back."""

    unreachable: dict[int, str] = field(default_factory=dict)
    armed: list[list[int]] = field(default_factory=list)
    """What each arm said waits (truthy once armed, as the probe's ``armed``)."""
    sent: list[dict] = field(default_factory=list)

    def send(self, units) -> None:
        if self.armed:
            self.sent.append({node: unit.ranks for node, unit in units.items()})

    def arm(self, waiting) -> None:
        self.armed.append(list(waiting))

    def check(self, workers) -> ProbeResult:
        found, self.unreachable = self.unreachable, {}
        return ProbeResult(unreachable=found)

    def reset(self) -> None:
        self.armed, self.sent = [], []


def warm_group(tmp_path, probe=None, clock: Optional[FakeClock] = None) -> tuple[WarmAgentGroup, FakeRanks, FakeAgents]:
    config = tiny_config(tmp_path, 30, save_interval=100)
    ranks, agents = FakeRanks(), FakeAgents(waiting_ranks={0, 2, 3})
    group = WarmAgentGroup(ranks, agents, warm_spares=1, probe=probe or FakeProbe(), clock=clock or FakeClock())
    group.start(config, ResumePlan())
    return group, ranks, agents


def spare_ready(ranks: FakeRanks, group: WarmAgentGroup) -> GroupPoll:
    ranks.side.append(("spare", SpareNews(name(NODE_B), -1, "ready", 555, "", NODE_B, "127.0.0.2")))
    return group.poll(0.0)


def test_spares_start_on_their_node_and_count_ready_only_once_their_agent_says_so(tmp_path):
    group, ranks, agents = warm_group(tmp_path)
    # Rank i's buddy on another node: two ranks a node, offset 2.
    assert ranks.warm == WarmRun(buddy_offset=2, live=True) and agents.started == [(name(NODE_B), 1, 2)]
    assert group.poll(0.0).ready_spares == 0 and group.warm_cover().spares == {}
    poll = spare_ready(ranks, group)
    assert poll.ready_spares == 1 and [event.kind for event in poll.spare_events] == ["spare_ready"]
    assert poll.spare_events[0].text == f"warm spare ready on node {name(NODE_B)} (pid 555) (1 of 1 ready)"
    assert group.warm_cover().spares == {name(NODE_B): 1}


def test_held_snapshots_pushed_by_the_agents_give_the_cover_its_step(tmp_path):
    group, ranks, _ = warm_group(tmp_path)
    ranks.side += [(HELD, HeldSnapshot(2, 6)), (HELD, HeldSnapshot(3, 7))]
    ranks.polls.append(GroupPoll(steps=[step_report(8)]))
    group.poll(0.0)
    assert group.warm_cover().snapshot_step == 8  # rank 0 committed step 8: live state serves in plain data parallel
    assert group.warm_cover().holders[1] == (name(NODE_A), name(NODE_B))  # every replica holds it


def test_a_recovery_asks_each_node_once_and_the_spare_takes_the_lost_rank(tmp_path):
    group, ranks, agents = warm_group(tmp_path)
    spare_ready(ranks, group)
    plan = ResumePlan(subrun="1.01")
    workers = group.recover(tiny_config(tmp_path, 30, 100), plan, WarmStart(step=8, ranks=(1,)))

    assert ranks.killed == [1] and ranks.subrun == "1.01"
    # One waiting call per node with a survivor, the rendezvous on rank 0's node, one regroup per node.
    assert agents.calls == [("waiting", name(NODE_A)), ("waiting", name(NODE_B)), ("rendezvous", name(NODE_A)),
                            ("regroup", name(NODE_A)), ("regroup", name(NODE_B))]
    subrun, named, answers, rank_nodes = agents.regroups[name(NODE_B)]
    assert subrun == "1.01" and named == {-1: 1} and sorted(answers) == [1, 2, 3]
    assert rank_nodes is None  # only rank 0's node sums step reports up per node
    subrun, named, answers, rank_nodes = agents.regroups[name(NODE_A)]
    assert named == {} and sorted(answers) == [0] and rank_nodes == {0: name(NODE_A), 1: name(NODE_B),
                                                                       2: name(NODE_B), 3: name(NODE_B)}
    rejoin = answers[0]
    assert (rejoin.dist_env.rank, rejoin.dist_env.world_size, rejoin.dist_env.master_addr,
            rejoin.dist_env.master_port) == (0, 4, "10.0.0.1", 29500)
    assert rejoin.donors == {1: 0} and rejoin.at_most == 8 and rejoin.plan is plan
    assert workers[1] == WorkerInfo(1, 901, NODE_B, "127.0.0.2") and ranks.adopted[0][1] == name(NODE_B)
    assert group.poll(0.0).ready_spares == 0 and group.warm_cover().snapshot_step is None  # the old group's snapshots

    # The spare is replaced in the slot rank 1 left (node A), once the re-formed group stepped past 8.
    ranks.polls.append(GroupPoll(steps=[step_report(8, "1.01")]))
    assert group.poll(0.0).spare_events == [] and len(agents.started) == 1
    ranks.polls.append(GroupPoll(steps=[step_report(9, "1.01")]))
    events = group.poll(0.0).spare_events
    assert [event.kind for event in events] == ["spare_refilling"] and agents.started[-1] == (name(NODE_A), 1, 2)
    assert "a new warm spare starts on node" in events[0].text and "the slot rank 1 left" in events[0].text


def test_too_few_spares_or_survivors_that_never_wait_are_a_warm_recovery_error(tmp_path, monkeypatch):
    group, ranks, agents = warm_group(tmp_path)
    with pytest.raises(WarmRecoveryError, match="0 ready spare"):
        group.recover(tiny_config(tmp_path, 30, 100), ResumePlan(), WarmStart(step=8, ranks=(1,)))
    assert ranks.killed == [] and agents.calls == []  # nothing done: the policy restarts cold
    spare_ready(ranks, group)
    agents.waiting_ranks = {0, 2}  # rank 3 never notices its lost peer
    monkeypatch.setattr(warm_agents, "SURVIVOR_WAIT_S", 0.0)
    with pytest.raises(WarmRecoveryError, match=r"rank\(s\) \[3\] did not notice"):
        group.recover(tiny_config(tmp_path, 30, 100), ResumePlan(), WarmStart(step=8, ranks=(1,)))


def test_a_spare_lost_before_it_was_named_is_not_offered(tmp_path):
    group, ranks, _ = warm_group(tmp_path)
    spare_ready(ranks, group)
    ranks.side.append(("spare", SpareNews(name(NODE_B), -1, "lost", 555, "Traceback\nMemoryError", NODE_B, "")))
    poll = group.poll(0.0)
    assert poll.ready_spares == 0 and [event.kind for event in poll.spare_events] == ["spare_lost"]
    assert "lost: MemoryError; it is not replaced (0 of 1 ready)" in poll.spare_events[0].text


def test_a_rank_lost_with_its_node_is_named_once_a_peer_waits_asked_through_its_agent(tmp_path):
    probe = FakeProbe()
    group, ranks, _ = warm_group(tmp_path, probe)
    group.poll(0.0)
    assert probe.sent == []  # no probe while all goes well
    probe.unreachable = {1: "rank 1's node aaaa ... (found by the driver's probe before Ray declared the node dead)"}
    ranks.polls.append(GroupPoll(waiting_ranks=[0]))
    poll = group.poll(0.0)
    assert probe.armed == [[0]]
    # One probe per node, for all its running ranks.
    assert probe.sent[-1] == {name(NODE_A): (0, 1), name(NODE_B): (2, 3)}
    assert [(f.rank, f.kind) for f in poll.failures] == [(1, "died")] and "before Ray declared" in poll.failures[0].text
    assert ranks.lost == [1]  # its end is not waited for
    group.poll(0.0)
    assert probe.sent[-1] == {name(NODE_A): (0,), name(NODE_B): (2, 3)}


def test_the_lost_node_probe_asks_each_node_once_a_poll_and_names_its_ranks_together(tmp_path, monkeypatch):
    """The real probe on a fake clock: once rank 2 (node B) waits, each poll asks node A's agent
    and node B's agent once, not each rank; node A's agent never answers and its raylet refuses,
    so ranks 0 and 1 are named lost in that poll, after one raylet check."""
    checked = []
    monkeypatch.setattr(liveness, "raylet_refusal", lambda host, port, timeout_s: checked.append(port) or "refused")
    clock = FakeClock()
    probe = PeerProbe(raylets=lambda: {NODE_A: ("127.0.0.1", 7001), NODE_B: ("127.0.0.1", 7002)}, clock=clock,
                      answers=FakeAnswers(clock))
    group, ranks, agents = warm_group(tmp_path, probe, clock)
    agents.waiting_ranks = set()
    group.poll(0.0)
    assert agents.probes == []  # no probe while all goes well
    agents.gone, agents.waiting_ranks = {name(NODE_A)}, {2, 3}
    ranks.polls.append(GroupPoll(waiting_ranks=[2]))
    poll = group.poll(0.0)
    assert agents.probes == [name(NODE_A), name(NODE_B)]  # 2 calls for 4 ranks
    assert [(f.rank, f.kind) for f in poll.failures] == [(0, "died"), (1, "died")] and checked == [7001]
    assert ranks.lost == [0, 1] and "rank 0's node aaaaaaaaaaaa is unreachable" in poll.failures[0].text
    group.poll(0.0)
    assert agents.probes[2:] == [name(NODE_B)]  # only the node with running ranks


def test_a_spare_not_ready_within_the_start_timeout_is_given_up_and_its_process_ended(tmp_path):
    clock = FakeClock()
    group, ranks, agents = warm_group(tmp_path, clock=clock)  # the ranks' start timeout: 5 s
    clock.now = 5.0
    assert group.poll(0.0).spare_events == []
    clock.now = 5.5
    poll = group.poll(0.0)
    assert [event.kind for event in poll.spare_events] == ["spare_lost"] and poll.ready_spares == 0
    assert poll.spare_events[0].text == (
        f"warm spare on node {name(NODE_B)} lost: it was not ready within 5 s of its start (it never said it waits "
        f"to be named; controller.start_timeout_s), so its process is ended; it is not replaced (0 of 1 ready)")
    assert agents.killed == [(name(NODE_B), -1)]
    # Its agent then says its process ended: the pool has given it up already, nothing more is said.
    ranks.side.append(("spare", SpareNews(name(NODE_B), -1, "lost", 555, "killed by SIGKILL", NODE_B, "")))
    assert group.poll(0.0).spare_events == [] and group.warm_cover().spares == {}


def test_a_spare_ready_in_time_is_never_given_up(tmp_path):
    clock = FakeClock()
    group, ranks, agents = warm_group(tmp_path, clock=clock)
    clock.now = 4.9
    spare_ready(ranks, group)
    clock.now = 1000.0
    poll = group.poll(0.0)
    assert poll.spare_events == [] and poll.ready_spares == 1 and agents.killed == []


def test_a_refill_never_passes_the_spares_wanted_and_a_node_with_no_free_device_is_said_not_refilled():
    # (Moved from the per-rank pool's test_spares.py, "never past the spares wanted", when that pool
    # was retired; the refusal is the agents' own: runmgr/agents/device_slices.py.)
    place_a, place_b = NodePlace(name(NODE_A), (0, 1), "agent-a"), NodePlace(name(NODE_B), (2, 3), "agent-b")
    full = {name(NODE_A)}
    started: list[str] = []

    def start(place: NodePlace, count: int) -> list[int]:
        if place.node in full:
            raise NoFreeDevices(f"node {place.node}'s agent holds 2 cuda device(s) (0,1), 1 per process, every slice "
                                f"held by a live process (0 by pid 100, 1 by pid 901): no device for a warm spare")
        started.append(place.node)
        return [-1]

    pool = AgentSparePool(1, start, start_timeout_s=180.0)
    [refused] = pool.refill([(place_a, 1)])
    assert refused.kind == "spare_not_refilled" and pool.spares == [] and started == []
    assert refused.text.startswith(f"no new warm spare on node {name(NODE_A)} in the slot rank 1 left: node "
                                   f"{name(NODE_A)}'s agent holds 2 cuda device(s)")
    assert refused.text.endswith("no device for a warm spare (0 of 1 ready)")
    full.clear()
    [refilling] = pool.refill([(place_a, 1), (place_b, 2)])  # one spare wanted
    assert refilling.kind == "spare_refilling" and started == [name(NODE_A)] and len(pool.spares) == 1
    assert pool.refill([(place_b, 2)]) == []  # full


def test_after_a_node_is_lost_a_restart_places_the_ranks_and_the_spares_the_nodes_left_have_room_for(tmp_path):
    # The two-node e2e's nodes (tests/e2e/test_resharding_resume.py): ranks and spare of 1.75 CPUs.
    bundle = {"CPU": 1.75}
    assert spares_with_room(bundle, 2, 1, {"head": {"CPU": 4.0}, "other": {"CPU": 3.0}}) == 1
    assert spares_with_room(bundle, 2, 1, {"head": {"CPU": 4.0}}) == 0  # the other node lost: the ranks only
    assert spares_with_room(bundle, 2, 3, {"head": {"CPU": 8.0}}) == 2
    assert spares_with_room(bundle, 4, 1, {"head": {"CPU": 4.0}}) == 0  # not even the ranks: placing says so
    # The warm group asked for its spare; the placement on the nodes left had no room for it.
    ranks, agents = FakeRanks(), FakeAgents()
    ranks.places = [NodePlace(name(NODE_A), (0, 1), "agent-a"), NodePlace(name(NODE_B), (2, 3), "agent-b")]
    group = WarmAgentGroup(ranks, agents, warm_spares=1, probe=FakeProbe(), clock=FakeClock())
    assert len(group.start(tiny_config(tmp_path, 30, save_interval=100), ResumePlan(avoid_nodes=("cccccccccccc",)))) == 4
    assert agents.started == []
    poll = group.poll(0.0)
    assert [event.kind for event in poll.spare_events] == ["spare_not_started"] and poll.ready_spares == 0
    assert poll.spare_events[0].text == ("1 warm spare not placed: the nodes the run may use without cccccccccccc have "
                                         "no room for it beside the ranks; the run goes on without it (0 of 1 ready)")
