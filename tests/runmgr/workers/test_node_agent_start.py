"""What a node's agent cannot start, in-process: a real :class:`NodeAgent` whose questions to
Ray (where it runs, which device ids Ray gave it) and whose push the test answers.

- A rank: an agent that holds fewer device ids than a rank needs forks nothing for that rank;
  it pushes the rank's end in words (runmgr/agents/device_slices.py's refusal), which the death
  detector reads as a node that did not hand out its devices: an incident naming the node, not
  a start timeout minutes later.
- A warm spare: an agent with no free device slice for a spare refuses it in the same words
  (``NoFreeDevices``), keeping the keys of the spares it forked before; at a sub-run's start the
  warm group makes that refusal a ``spare_not_started`` event and the run starts without the
  spare (a refill refused is ``spare_not_refilled``: tests/runmgr/workers/test_warm_agents.py).
  No process is forked: the agent's process table is the test's (:class:`NoForks`).
"""

from __future__ import annotations

import pickle

import pytest

from runmgr.agents.device_slices import NoFreeDevices
from runmgr.agents.rank_processes import RankStart
from runmgr.agents.report import NodeReport
from runmgr.controller.group import WarmRecoveryError, WarmStart, WorkerInfo
from runmgr.nodes import node_name
from runmgr.placement import rank_device_env
from runmgr.watch.deaths import DeathDetector
from runmgr.watch.observations import WorkerExit
from runmgr.workers.agent_group import NodePlace
from runmgr.workers.node_agent import NodeAgent
from runmgr.workers.warm_agents import WarmAgentGroup
from tests.runmgr.agents.configs import tiny_config
from tests.runmgr.workers.probe_fakes import FakeClock
from tests.runmgr.workers.test_warm_agents import NODE_B, FakeProbe, FakeRanks
from trainer.plan import ResumePlan

NODE_ID = "c" * 40
MASTER = ("127.0.0.1", 29500)


class InProcessAgent(NodeAgent):
    """A node agent outside Ray: the test says which GPU ids Ray gave it; pushes are kept."""

    def __init__(self, gpu_ids: list[str], devices_per_rank: int, node: str = "node-c") -> None:
        super().__init__(node, push_interval_s=0.05, device_kind="cuda", devices_per_rank=devices_per_rank)
        self.gpu_ids = gpu_ids
        self.pushed: list[NodeReport] = []

    def _here(self) -> tuple[str, str]:
        return NODE_ID, "127.0.0.1"

    def _device_ids(self, resource: str) -> list[str]:
        assert resource == "GPU"
        return list(self.gpu_ids)

    def _push(self, inbox, reports: list[NodeReport]) -> float:
        self.pushed += reports
        return 0.0


def test_a_rank_short_of_device_ids_ends_in_its_own_words_and_nothing_is_forked(tmp_path):
    agent = InProcessAgent(["3"], devices_per_rank=2)
    # One rank of two devices on an agent Ray gave one: the sub-run's serve returns once its rank ended.
    agent.run((0,), 1, MASTER, tiny_config(tmp_path, 4, save_interval=2), ResumePlan(subrun="1.00"),
              None, inbox=None)
    assert agent.processes.pids() == {}  # no process forked with another rank's device, or every device
    assert agent.describe() == [WorkerInfo(0, 0, NODE_ID, "127.0.0.1")]
    (end,) = [end for report in agent.pushed for end in report.ended]
    assert (end.rank, end.kind) == (0, "error")
    assert end.text == ("rank 0 could not start: node node-c's agent holds 1 cuda device(s) (3), 2 per process, "
                        "too few for one slice: no device for rank 0")
    # What the judge makes of it (runmgr/controller/judge.py hands the failure's text to the detector).
    (incident,) = DeathDetector().update(WorkerExit(0, "node-c", f"{end.text} (pid 0 on 127.0.0.1)",
                                                    end.time, None, "1.00"), end.time)
    assert incident.nodes == ("node-c",) and incident.ranks == (0,)
    assert (incident.evidence["cause"], incident.evidence["category"]) == ("devices_not_given", "node")
    assert "too few for one slice: no device for rank 0" in incident.description


class NoForks:
    """The agent's process table without processes: each start is kept under a made-up pid that
    lives until the test ends."""

    def __init__(self) -> None:
        self.started: dict[int, tuple[int, RankStart]] = {}

    def start(self, start: RankStart) -> int:
        pid = 4000 + len(self.started)
        self.started[start.rank] = (pid, start)
        return pid

    def live_pids(self) -> set[int]:
        return {pid for pid, _ in self.started.values()}

    def pids(self) -> dict[int, int]:
        return {key: pid for key, (pid, _) in self.started.items()}


def spare_node(tmp_path, gpu_ids: list[str], devices_per_rank: int, node: str = "node-c") -> InProcessAgent:
    """An agent serving a sub-run on a node that holds only spares (its ``run`` returns at once)."""
    agent = InProcessAgent(gpu_ids, devices_per_rank, node)
    agent.processes = NoForks()
    agent.run((), 4, MASTER, tiny_config(tmp_path, 4, save_interval=2), ResumePlan(subrun="1.00"), None, inbox=None)
    return agent


def test_spares_past_the_node_s_device_slices_are_refused_in_its_words_keeping_those_forked_before(tmp_path):
    agent = spare_node(tmp_path, ["0", "1"], devices_per_rank=1)
    with pytest.raises(NoFreeDevices) as refused:
        agent.start_spares(3, buddy_offset=1)
    assert str(refused.value) == ("node node-c's agent holds 2 cuda device(s) (0,1), 1 per process, every slice held "
                                  "by a live process (0 by pid 4000, 1 by pid 4001): no device for a warm spare")
    # The two forked before the refusal run, each on a slice of its own: the driver must know them.
    assert refused.value.started == [-1, -2] and sorted(agent.processes.pids()) == [-2, -1]
    assert [start.env for _, start in agent.processes.started.values()] == [
        rank_device_env("cuda", ("0", "1"), 1, index) for index in (0, 1)]
    carried = pickle.loads(pickle.dumps(refused.value))  # as Ray carries it to the driver
    assert str(carried) == str(refused.value) and carried.started == [-1, -2]


class SparesOn:
    """The warm group's agents, whose ``start_spares`` is the in-process agent's, its refusal
    carried back as Ray carries it (pickled)."""

    def __init__(self, agent: InProcessAgent) -> None:
        self.agent = agent

    def start_spares(self, place: NodePlace, count: int, buddy_offset: int) -> list[int]:
        try:
            return self.agent.start_spares(count, buddy_offset)
        except NoFreeDevices as refused:
            raise pickle.loads(pickle.dumps(refused)) from None


def test_an_initial_spare_its_agent_refuses_is_an_event_in_its_words_and_the_run_starts_without_it(tmp_path):
    # Node B holds ranks 2-3 and the run's one spare (FakeRanks); its agent was given one GPU id
    # where a process takes two (Ray told of GPUs it gave too few ids for).
    node_b = node_name(NODE_B)
    agent = spare_node(tmp_path, ["3"], devices_per_rank=2, node=node_b)
    ranks = FakeRanks()
    group = WarmAgentGroup(ranks, SparesOn(agent), warm_spares=1, probe=FakeProbe(), clock=FakeClock())
    config = tiny_config(tmp_path, 30, save_interval=100)
    assert len(group.start(config, ResumePlan())) == 4  # the ranks start
    assert agent.processes.started == {}  # no spare forked with another's device, or none
    poll = group.poll(0.0)
    assert [event.kind for event in poll.spare_events] == ["spare_not_started"] and poll.ready_spares == 0
    assert poll.spare_events[0].text == (
        f"1 warm spare placed on node {node_b} not started: node {node_b}'s agent holds 1 cuda device(s) (3), 2 per "
        f"process, too few for one slice: no device for a warm spare; the run goes on without it (0 of 1 ready)")
    assert group.warm_cover().spares == {}
    # A fault now restarts cold: the policy reads no spare in the cover, and a warm recovery has none.
    with pytest.raises(WarmRecoveryError, match="0 ready spare"):
        group.recover(config, ResumePlan(subrun="1.01"), WarmStart(step=8, ranks=(1,)))
