"""The agent design's worker group on a real local Ray, with the scale harness's simulated
node agents: one drain per poll brings every node's news; a rank killed on the driver's word
and a node whose agent dies are each reported as deaths."""

from __future__ import annotations

import pytest
import ray

from runmgr.scale.agent_hosts import RemoteNodeAgentHost, SimulatedNodeAgents
from runmgr.scale.harness import ScaleJob
from trainer.plan import ResumePlan
from runmgr.workers.agent_group import AgentWorkerGroup

pytestmark = pytest.mark.slow


def poll_until(group, wanted, polls=200):
    """Poll until ``wanted(poll)``; every poll seen."""
    seen = []
    for _ in range(polls):
        seen.append(group.poll(0.2))
        if wanted(seen[-1]):
            return seen
    raise AssertionError(f"not seen in {polls} polls")


def test_one_drain_per_poll_hears_every_node_and_a_dead_agent_takes_its_nodes_ranks(local_ray, tmp_path):
    job = ScaleJob(ranks=32, ranks_per_node=8, hosts=2, step_s=0.2, train_iters=1000, design="agents",
                   push_interval_s=0.1)
    hosts = [RemoteNodeAgentHost.remote(job.script(), job.push_interval_s) for _ in range(job.hosts)]
    group = AgentWorkerGroup(SimulatedNodeAgents(hosts, job.nodes, job.ranks_per_node), job.ranks)
    workers = group.start(job.config(tmp_path / "run").trainer_config(), ResumePlan(subrun="1.00"))
    assert [w.rank for w in workers] == list(range(32))
    assert {w.node_id for w in workers} == {"sim00000", "sim00001", "sim00002", "sim00003"}
    try:
        seen = poll_until(group, lambda poll: any(r.step >= 2 for r in poll.steps))
        beats = [beat for poll in seen for beat in poll.node_beats]
        assert {beat.rank for beat in beats} == {0, 8, 16, 24}  # each node's laggard (its lowest rank on a tie)
        assert not any(poll.heartbeats for poll in seen)  # no per-rank beat reaches the driver
        timings = next(o for poll in seen for o in poll.observations if type(o).__name__ == "RankTimings")
        assert len(timings.seconds) == 4  # one per node, not one per rank

        group.kill(9)
        [death] = poll_until(group, lambda poll: poll.failures)[-1].failures
        assert (death.rank, death.kind, death.worker.node_id) == (9, "died", "sim00001")

        ray.kill(hosts[0])  # the agents of sim00000 and sim00002
        died = [f for poll in poll_until(group, lambda poll: poll.failures) for f in poll.failures]
        assert sorted(f.rank for f in died) == list(range(0, 8)) + list(range(16, 24))
        assert "the agent of node sim00000 died" in next(f.text for f in died if f.rank == 0)
    finally:
        group.shutdown()
