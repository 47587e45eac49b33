"""The agent design's worker group on a real local Ray, with the scale harness's simulated
node agents: one drain per poll brings every node's news; a rank killed on the driver's word
and a node whose agent dies are each reported as deaths; a launch's inbox kept across its
sub-runs gives each only its own reports."""

from __future__ import annotations

import pytest
import ray

from runmgr.agents.report import NodeReport, RankEnd
from runmgr.scale.agent_hosts import RemoteNodeAgentHost, SimulatedNodeAgents
from runmgr.scale.harness import ScaleJob
from runmgr.workers.agent_group import AgentWorkerGroup
from runmgr.workers.inbox import KeptInbox
from trainer.plan import ResumePlan

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


def test_a_kept_inbox_serves_the_next_sub_run_and_drops_what_the_last_one_pushed_late(local_ray, tmp_path):
    job = ScaleJob(ranks=8, ranks_per_node=4, hosts=1, step_s=0.2, train_iters=1000, design="agents",
                   push_interval_s=0.1)
    hosts = [RemoteNodeAgentHost.remote(job.script(), job.push_interval_s)]
    agents = SimulatedNodeAgents(hosts, job.nodes, job.ranks_per_node)
    config = job.config(tmp_path / "run").trainer_config()
    inbox = KeptInbox()
    try:
        first = AgentWorkerGroup(agents, job.ranks, inbox=inbox)
        first.start(config, ResumePlan(subrun="1.00"))
        assert {r.subrun for r in poll_until(first, lambda poll: poll.steps)[-1].steps} == {"1.00"}
        first.shutdown()
        # An agent of the stopped sub-run pushes after the stop, as a push already under way would.
        late = NodeReport("sim00000", "1.00", 0.0, items=(("heartbeat", "from 1.00"),),
                          ended=(RankEnd(0, "died", "late", 0.0),))
        ray.get(inbox.actor().push.remote([late]))

        second = AgentWorkerGroup(agents, job.ranks, inbox=inbox)
        second.start(config, ResumePlan(subrun="1.01"))
        seen = poll_until(second, lambda poll: poll.steps)
        assert {r.subrun for poll in seen for r in poll.steps} == {"1.01"}
        assert not any(poll.heartbeats or poll.failures for poll in seen), "a report of 1.00 reached 1.01"
        second.shutdown()
        assert isinstance(ray.get(inbox.actor().drain.remote(0)), list)  # the group left the kept inbox serving
    finally:
        inbox.close()


def test_an_agent_dead_before_its_ranks_start_is_a_failed_launch_not_a_crash(local_ray, tmp_path):
    from runmgr.errors import ClusterError

    job = ScaleJob(ranks=8, ranks_per_node=4, hosts=1, step_s=0.2, train_iters=1000, design="agents")
    hosts = [RemoteNodeAgentHost.remote(job.script(), job.push_interval_s) for _ in range(job.hosts)]
    group = AgentWorkerGroup(SimulatedNodeAgents(hosts, job.nodes, job.ranks_per_node), job.ranks)
    ray.kill(hosts[0])
    with pytest.raises(ClusterError, match="a node agent died before its ranks started"):
        group.start(job.config(tmp_path / "run").trainer_config(), ResumePlan(subrun="1.00"))
