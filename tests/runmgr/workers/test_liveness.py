"""A rank lost with its node is named while its peers wait for it, and only then: the driver's
probe (runmgr/workers/liveness.py) on real actors of a real local Ray and real sockets.

A live node whose agent answers no probe (its only thread busy) beside a node whose rank waits
in its warm link is checked and cleared, because its raylet (the real one) takes a connection.
The same node whose raylet refuses one (its address pointed at a closed port: the connection a
dead raylet's host refuses) has its rank named lost, in words the watcher reads as a lost node.
The agents are stand-ins on a real local Ray (tests/runmgr/workers/standins.py), answering as
node_agent.py's ``waiting`` does. A whole node killed for real is bench/restart_latency.py's
runmgr-warm-node arm.

The probe's rules at many nodes run in-process on a fake clock with fake calls: one call per
node a poll, whatever the ranks."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import ray

from runmgr.controller.group import WorkerInfo
from runmgr.ports import rendezvous_port
from runmgr.watch.deaths import classify
from runmgr.workers import liveness
from runmgr.workers.liveness import PeerProbe, ProbeResult, ProbeUnit, ray_raylets, raylet_refusal, silent_ranks
from tests.runmgr.workers.probe_fakes import Call, FakeAnswers, FakeClock
from tests.runmgr.workers.standins import remote_agent

SAFETY_S = 60.0
"""Only against a test that would otherwise never end; no assertion depends on it."""
POLL_S = 0.05
"""Between two rounds of probes, as between the driver's polls."""


def closed_port() -> int:
    """A port of this host where nothing listens: free now, and below the ephemeral range, where no
    other process's ``bind(0)`` or outgoing connection takes it (runmgr/ports.py)."""
    return rendezvous_port()


def test_only_ranks_silent_past_the_probe_while_a_peer_waits_are_checked():
    assert silent_ranks([], {1: 5.0}, 0.3) == []  # nobody waits in the link: a slow rank broke nothing
    assert silent_ranks([0], {1: 0.29, 2: 0.3, 3: 4.0}, 0.3) == [2, 3]
    assert silent_ranks([0, 1], {1: 4.0}, 0.3) == []  # a waiting rank is no suspect


def test_a_listening_raylet_takes_the_connection_and_a_gone_one_refuses_it(local_ray):
    host, port = next(iter(ray_raylets().values()))  # this test Ray's own raylet
    assert raylet_refusal(host, port, 0.3) is None
    assert raylet_refusal("127.0.0.1", closed_port(), 0.3) == "Connection refused"


@pytest.fixture
def ranks(local_ray, tmp_path):
    """Rank 0's agent says it waits in its warm link; rank 1's lives but answers no probe until released."""
    survivor, busy = remote_agent(waiting=[0]), remote_agent(waiting=[])
    release = tmp_path / "release"
    held = busy.hold.remote(str(release))
    node = ray.get_runtime_context().get_node_id()
    workers = [WorkerInfo(0, 100, node, "127.0.0.1"), WorkerInfo(1, 101, node, "127.0.0.1")]
    yield [survivor, busy], workers
    release.touch()
    ray.get(held)
    for actor in (survivor, busy):
        ray.kill(actor, no_restart=True)


def units(actors) -> dict[int, ProbeUnit]:
    """Each stand-in agent as a probe unit of its one rank (an agent per node here)."""
    return {rank: ProbeUnit((rank,), lambda actor=actor: actor.waiting.remote()) for rank, actor in enumerate(actors)}


def probe_until_rank_1_is_checked(probe: PeerProbe, actors, workers) -> ProbeResult:
    probe.arm([0])  # rank 0's drain said it waits in its warm link
    deadline = time.monotonic() + SAFETY_S
    while True:
        probe.send(units(actors))
        result = probe.check(workers)
        if 1 in result.silent:
            return result
        assert time.monotonic() < deadline, "rank 1 was never checked"
        time.sleep(POLL_S)


def test_no_rank_is_probed_until_a_drain_says_one_waits(ranks):
    # While all goes well a probe costs the ranks' CPU for nothing: none is sent.
    actors, workers = ranks
    probe = PeerProbe()
    probe.send(units(actors))
    assert probe.check(workers) == ProbeResult()
    probe.arm([])
    probe.send(units(actors))
    assert probe.check(workers) == ProbeResult()
    assert probe_until_rank_1_is_checked(probe, actors, workers).waiting == (0,)


def test_a_live_rank_that_answers_no_probe_is_not_named_lost(ranks):
    actors, workers = ranks
    result = probe_until_rank_1_is_checked(PeerProbe(), actors, workers)
    assert result.waiting == (0,) and result.unreachable == {}


def test_a_silent_rank_whose_raylet_refuses_is_named_lost_with_its_node(ranks):
    actors, workers = ranks
    node = workers[1].node_id
    probe = PeerProbe(raylets=lambda: {node: ("127.0.0.1", closed_port())})
    result = probe_until_rank_1_is_checked(probe, actors, workers)
    assert result.waiting == (0,) and list(result.unreachable) == [1]
    text = result.unreachable[1]
    assert f"rank 1's node {node[:12]} is unreachable" in text and "Connection refused" in text
    assert "while rank(s) 0 wait for a lost peer" in text
    cause = classify(text)
    assert (cause.name, cause.category) == ("node_lost", "node")  # the policy excludes the node


NODES, RANKS_PER_NODE = 16, 8


@pytest.fixture
def refusals(monkeypatch) -> Counter:
    """Each node's raylet check, counted: every raylet refuses (only the silent ranks' are checked)."""
    checked: Counter = Counter()

    def refuse(host: str, port: int, timeout_s: float) -> str:
        checked[port] += 1
        return "Connection refused"

    monkeypatch.setattr(liveness, "raylet_refusal", refuse)
    return checked


def test_through_node_agents_a_poll_costs_one_call_per_node_and_a_lost_nodes_ranks_are_named_together(refusals):
    """16 nodes of 8 ranks: 16 calls a poll, not 128. Once node 3's agent stops answering, its 8
    ranks are named lost in the same poll, after one check of its raylet, not eight."""
    clock = FakeClock()
    asked: Counter = Counter()
    gone: set[int] = set()

    def agent(node: int) -> Call:
        asked[node] += 1
        return Call(node, None if node in gone else [5] if node == 0 else [])  # rank 5 waits in its link

    units = {node: ProbeUnit(tuple(range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE)),
                             lambda node=node: agent(node)) for node in range(NODES)}
    workers = [WorkerInfo(rank, 1000 + rank, f"{rank // RANKS_PER_NODE:040x}", "127.0.0.1")
               for rank in range(NODES * RANKS_PER_NODE)]
    raylets = {f"{node:040x}": ("127.0.0.1", 7000 + node) for node in range(NODES)}
    probe = PeerProbe(raylets=lambda: raylets, clock=clock, answers=FakeAnswers(clock))

    def poll() -> tuple[int, ProbeResult]:
        before = sum(asked.values())
        probe.send(units)
        result = probe.check(workers)
        clock.now += 0.05  # the next poll
        return sum(asked.values()) - before, result

    assert poll() == (0, ProbeResult())  # nobody waits: no call at all
    probe.arm([5])
    for _ in range(3):
        calls, result = poll()
        assert (calls, result.waiting, result.unreachable) == (NODES, (5,), {})
    gone.add(3)
    calls, result = poll()
    assert calls == NODES and result.silent == tuple(range(24, 32))
    assert sorted(result.unreachable) == list(range(24, 32)) and refusals == {7003: 1}
    assert "rank 24's node 000000000000 is unreachable" in result.unreachable[24]
    assert "while rank(s) 5 wait for a lost peer" in result.unreachable[31]
    del units[3]  # its ranks are lost: the group probes the running ranks' nodes
    calls, result = poll()
    assert calls == NODES - 1 and result.unreachable == {} and result.waiting == (5,)


def test_an_agents_answer_counts_only_for_its_units_ranks():
    assert ProbeUnit((8, 9), lambda: None).waiting([9, 2]) == {9}
