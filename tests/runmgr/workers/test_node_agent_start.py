"""A rank its node's agent cannot start, in-process: a real :class:`NodeAgent` whose questions to
Ray (where it runs, which device ids Ray gave it) and whose push the test answers. An agent
that holds fewer device ids than a rank needs forks nothing for that rank; it pushes the rank's
end in words (runmgr/agents/device_slices.py's refusal), which the death detector reads as a node that did
not hand out its devices: an incident naming the node, not a start timeout minutes later."""

from __future__ import annotations

from runmgr.agents.report import NodeReport
from runmgr.controller.group import WorkerInfo
from runmgr.watch.deaths import DeathDetector
from runmgr.watch.observations import WorkerExit
from runmgr.workers.node_agent import NodeAgent
from tests.runmgr.agents.configs import tiny_config
from trainer.plan import ResumePlan

NODE_ID = "c" * 40


class InProcessAgent(NodeAgent):
    """A node agent outside Ray: the test says which GPU ids Ray gave it; pushes are kept."""

    def __init__(self, gpu_ids: list[str], devices_per_rank: int) -> None:
        super().__init__("node-c", push_interval_s=0.05, device_kind="cuda", devices_per_rank=devices_per_rank)
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
    agent.run((0,), 1, ("127.0.0.1", 29500), tiny_config(tmp_path, 4, save_interval=2), ResumePlan(subrun="1.00"),
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
