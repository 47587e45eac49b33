"""From what the workers said to what to do: observations go to the watcher,
incidents to the policy, decisions back to the controller.

The judge holds the lineage's memory (the watcher's detectors and the
policy's history); the watcher and the policy stay pure. The controller
executes what the judge returns; observers record it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.config import PolicyConfig
from runmgr.policy.decision import ABORT, Decision
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.watch.config import WatcherConfig
from runmgr.watch.incidents import Incident
from runmgr.watch.observations import DeviceObservation, HeartbeatObservation, StepObservation, WorkerExit
from runmgr.watch.watcher import Watcher
from runmgr.workers.actor import WorkerInfo
from runmgr.workers.group import GroupPoll, WorkerFailure, root_cause


NODE_NAME_CHARS = 12


def node_name(node_id: str) -> str:
    """How incidents and exclusions name a Ray node: the start of its id
    (unique in a cluster; IPs are not when nodes share a host)."""
    return node_id[:NODE_NAME_CHARS]


@dataclass(frozen=True)
class Judgement:
    """An incident and the policy's decision on it."""

    incident: Incident
    decision: Decision

    @property
    def ends_subrun(self) -> bool:
        return self.decision.restarts or self.decision.action == ABORT


class Judge:
    """Feeds the watcher, asks the policy, remembers the decisions."""

    def __init__(self, watcher_config: WatcherConfig, policy_config: PolicyConfig,
                 checkpoints: Callable[[int], Sequence[VerifiedCheckpoint]]) -> None:
        """``checkpoints(max_step)``: the verified checkpoints at or before ``max_step``."""
        self.watcher_config = watcher_config
        self.policy_config = policy_config
        self.checkpoints = checkpoints
        self.history = History()
        self.watcher = Watcher(watcher_config)
        self._nodes: dict[int, str] = {}

    def start_subrun(self, workers: Sequence[WorkerInfo]) -> None:
        """New ranks: the per-rank detectors start afresh with their placement."""
        self._nodes = {w.rank: node_name(w.node_id) for w in workers}
        self.watcher = self.watcher.for_new_subrun(self._nodes)

    def judge(self, subrun: str, poll: GroupPoll, devices: Sequence[DeviceObservation], now: float,
              last_step: int) -> list[Judgement]:
        """Every incident this poll (and the silence since the last one) produced, decided.
        With ``watcher.enabled`` false only worker deaths are judged."""
        detecting = self.watcher_config.enabled
        incidents = self._detect(subrun, poll, devices, now) if detecting else []
        if poll.failures:
            incidents += self.watcher.observe(self._exit_of(root_cause(poll.failures), subrun), now)
        for rank in poll.finished_ranks:
            self.watcher.hang.forget(rank)
        if detecting and not poll.failures:
            incidents += self.watcher.check(now)
        return [self._decide(incident, last_step) for incident in incidents]

    def _detect(self, subrun: str, poll: GroupPoll, devices: Sequence[DeviceObservation],
                now: float) -> list[Incident]:
        """The detectors' incidents from this poll's reports, heartbeats and device readings."""
        incidents: list[Incident] = []
        for report in poll.steps:
            incidents += self.watcher.observe(StepObservation.from_report(report), now)
        for beat in poll.heartbeats:
            observation = HeartbeatObservation.from_heartbeat(beat, self._nodes.get(beat.rank, ""), subrun)
            incidents += self.watcher.observe(observation, now)
        for reading in devices:
            incidents += self.watcher.observe(reading, now)
        return incidents

    def _exit_of(self, failure: WorkerFailure, subrun: str) -> WorkerExit:
        worker = failure.worker
        node = node_name(worker.node_id) if worker else self._nodes.get(failure.rank, "")
        where = f"pid {worker.pid} on {worker.node_ip}" if worker else "pid unknown"
        return WorkerExit(failure.rank, node, f"{failure.text} ({where})", failure.time, None, subrun)

    def _decide(self, incident: Incident, last_step: int) -> Judgement:
        checkpoints = list(self.checkpoints(last_step))
        decision = decide(incident, self.history, self.policy_config, checkpoints)
        self.history = self.history.record(incident, decision, checkpoints)
        return Judgement(incident, decision)
