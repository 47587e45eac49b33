"""From what the workers said to what to do: observations go to the watcher,
incidents to the policy, decisions back to the controller.

The judge holds the lineage's memory (the watcher's detectors and the
policy's history); the watcher and the policy stay pure. The controller
executes what the judge returns; observers record it. ``runmgr watch
replay`` drives the same judge over a recorded log.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from typing import Callable, Mapping, Optional, Sequence

from runmgr.controller.judgement import Judgement
from runmgr.controller.group import GroupPoll, OutputLine, WorkerFailure, WorkerInfo, root_cause
from runmgr.policy.abilities import BUILTIN_ABILITIES, TrainerAbilities
from runmgr.policy.capacity import Capacity
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.decision import Decision, held_for_approval
from runmgr.config.policy import PolicyConfig
from runmgr.policy.history import History
from runmgr.policy.ladder import decide
from runmgr.policy.warm import WarmCover
from runmgr.config.watcher import WatcherConfig
from logbook.local_norms import analyse
from runmgr.watch.incidents import EARLY_EXIT, HANG, INSTABILITY_KINDS, WORKER_DEATH, Incident
from runmgr.watch.observations import (
    HeartbeatObservation, JobEnded, LaunchFailure, LocalNormsObservation, StepObservation, WorkerExit,
)
from runmgr.watch.text import printable
from runmgr.nodes import node_name
from runmgr.watch.watcher import Observation, Watcher

LAST_OUTPUT_LINES = 20
"""Lines of each node's output the judge keeps for an incident that names none of its own
(a hang, an early exit)."""
LAST_OUTPUT_NODES = 8
"""Nodes whose last lines the judge keeps: those that printed last (at a few hundred nodes, every
node's lines would make an incident of thousands)."""
OUTPUT_LINE_CHARS = 1000
"""A kept line's length at most: a job may print anything, of any length."""


def no_warm_cover() -> Optional[WarmCover]:
    """A worker group that keeps no warm state."""
    return None


@dataclass(frozen=True)
class ClusterSlots:
    """How the judge learns what the cluster can hold when a decision is due."""

    slots_by_node: Callable[[], Mapping[str, int]]
    """Ranks each usable (alive, admitted) node can hold now, by node name."""
    data_parallel_sizes: tuple[int, ...]
    """Data-parallel sizes the trainer can run, at most the configured one."""
    ranks_per_replica: int = 1
    """Ranks of one data-parallel replica (tensor x pipeline parallel)."""
    replacement_wait_s: Optional[float] = None
    """The cluster replaces an excluded node within about this long (KubeRay); None: it does not."""


class Judge:
    """Feeds the watcher, asks the policy, remembers the decisions."""

    def __init__(self, watcher_config: WatcherConfig, policy_config: PolicyConfig,
                 checkpoints: Callable[[int], Sequence[VerifiedCheckpoint]],
                 cluster: Optional[ClusterSlots] = None, abilities: TrainerAbilities = BUILTIN_ABILITIES) -> None:
        """``checkpoints(max_step)``: the verified checkpoints at or before ``max_step``;
        ``cluster``: None where no cluster is in view (a replay keeps the sizes);
        ``abilities``: the remedies the trainer in use can carry out."""
        self.watcher_config = watcher_config
        self.policy_config = policy_config
        self.checkpoints = checkpoints
        self.cluster = cluster
        self.abilities = abilities
        self.history = History()
        self.watcher = Watcher(watcher_config)
        self._nodes: dict[int, str] = {}
        self._data_parallel: Optional[int] = None
        self._warm_cover: Callable[[], Optional[WarmCover]] = no_warm_cover
        self._subrun = SubrunMemory()
        self._lineage_steps = 0
        self._held: Optional[tuple[Incident, Decision, list[VerifiedCheckpoint]]] = None
        """The remedy held for a person's approval, with what it was decided on."""

    def start_subrun(self, workers: Sequence[WorkerInfo],
                     warm_cover: Callable[[], Optional[WarmCover]] | None = None,
                     start_step: int = 0, final_step: Optional[int] = None) -> None:
        """New ranks: the per-rank detectors start afresh with their placement.
        ``warm_cover()``: what the sub-run's group could recover warm when a decision is
        due (None: a group that keeps no warm state; every restart is cold); ``start_step``:
        where the sub-run starts; ``final_step``: the run's last step (None: not judged when
        every rank exits 0)."""
        self._warm_cover = warm_cover or no_warm_cover
        self.restart_detectors({w.rank: node_name(w.node_id) for w in workers})
        self._subrun = SubrunMemory(start_step, final_step, len(workers))

    def restart_detectors(self, rank_nodes: Mapping[int, str]) -> None:
        """A new sub-run of ``len(rank_nodes)`` ranks (a replay knows no nodes)."""
        self._nodes = dict(rank_nodes)
        per_replica = self.cluster.ranks_per_replica if self.cluster else 1
        self._data_parallel = len(rank_nodes) // per_replica or None
        self.watcher = self.watcher.for_new_subrun(self._nodes)

    def next_silence_at(self) -> Optional[float]:
        """When the watcher would first report a silence if no rank were heard before (None: never)."""
        return self.watcher.next_silence_at()

    def judge(self, subrun: str, poll: GroupPoll, readings: Sequence[Observation], now: float,
              last_step: int) -> list[Judgement]:
        """Every incident this poll, the ``readings`` from outside the ranks (device polls,
        the S3 mirror's uploads) and the time since the last poll produced, decided.
        With ``watcher.enabled`` false only worker deaths are judged."""
        detecting = self.watcher_config.enabled
        observations: list[Observation] = self._observations(subrun, poll, readings) if detecting else []
        self._remember(poll)
        if poll.failures:
            observations.append(self._exit_of(root_cause(poll.failures), subrun))
        for rank in poll.finished_ranks:
            self.watcher.hang.finish(rank)
        ended = self._ended(subrun, poll, now, last_step)
        if ended is not None:  # judged like a death: whether or not the watcher runs
            observations.append(ended)
        return self.judge_observations(observations, now, last_step,
                                       check_silence=detecting and not poll.failures)

    def _remember(self, poll: GroupPoll) -> None:
        """Keep what an incident may need later: the last lines of each node's output, how many
        steps the sub-run and the lineage reported, which ranks finished."""
        self._subrun.keep_output(poll.output)
        stepped = len(poll.steps) or sum(isinstance(o, StepObservation) for o in poll.observations)
        self._subrun.steps_reported += stepped
        self._lineage_steps += stepped
        self._subrun.finished.update(poll.finished_ranks)

    def _ended(self, subrun: str, poll: GroupPoll, now: float, last_step: int) -> Optional[JobEnded]:
        """The end of the sub-run, once every rank exited 0 (once), when its last step is known."""
        memory = self._subrun
        if (memory.final_step is None or memory.ended or not poll.finished_ranks or poll.failures
                or len(memory.finished) < memory.ranks):
            return None
        memory.ended = True
        verified = self.checkpoints(last_step)
        newest = max((c.step for c in verified), default=None)
        return JobEnded(subrun, now, last_step, memory.final_step, memory.start_step, newest,
                        memory.steps_reported, memory.last_output())

    def launch_failed(self, subrun: str, text: str, now: float, last_step: int,
                      data_parallel: Optional[int], warm: bool = False) -> Judgement:
        """The workers of ``subrun`` (``data_parallel`` replicas) could not be placed or started
        (``warm``: its warm restart failed, and the group with it)."""
        self._data_parallel = data_parallel
        self._warm_cover = no_warm_cover
        return self.judge_observations([LaunchFailure(subrun, text, now, warm)], now, last_step)[0]

    def judge_observations(self, observations: Sequence[Observation], now: float, last_step: int,
                           check_silence: bool = False) -> list[Judgement]:
        """Feed ``observations`` to the watcher (and check for silence), then decide on
        each incident in order, with the checkpoints verified up to ``last_step``."""
        incidents = self.watcher.observe_all(observations, now)
        if check_silence:
            incidents += self.watcher.check(now)
        return [self._decide(self._explained(incident), last_step) for incident in incidents]

    def _explained(self, incident: Incident) -> Incident:
        """An instability with the evidence ``local_norms`` (docs/local_norms.md): the weights whose
        gradient norm jumped first and most from its onset on, when the lineage recorded norms
        before and at it; a hang, a death or an early exit with what the lineage has reported so
        far (``never_stepped``) and the nodes' last output where it carries none of its own."""
        if incident.kind in (HANG, WORKER_DEATH, EARLY_EXIT):
            return self._with_output(incident)
        if incident.kind not in INSTABILITY_KINDS or incident.onset_step is None:
            return incident
        moves = analyse(self.watcher.local_norms.series(), incident.onset_step)
        if moves is None:
            return incident
        return replace(incident, evidence={**incident.evidence, "local_norms": moves.evidence()})

    def _with_output(self, incident: Incident) -> Incident:
        extra: dict = {"never_stepped": self._lineage_steps == 0}
        if "last_output" not in incident.evidence:
            lines = self._subrun.last_output()
            if lines:
                extra["last_output"] = list(lines)
            if self._subrun.nodes_left_out:
                extra["last_output_nodes_left_out"] = self._subrun.nodes_left_out
        return replace(incident, evidence={**incident.evidence, **extra})

    def _observations(self, subrun: str, poll: GroupPoll,
                      readings: Sequence[Observation]) -> list[Observation]:
        """The detectors' inputs from this poll's reports, heartbeats and the outside readings."""
        # Local norms first: a spike reported at a step is explained by the norms up to that step.
        found: list[Observation] = [LocalNormsObservation.from_report(report) for report in poll.local_norms]
        found += (list(poll.observations) if poll.observations
                  else [StepObservation.from_report(report) for report in poll.steps])
        found += [HeartbeatObservation.from_heartbeat(beat, self._nodes.get(beat.rank, ""), subrun)
                  for beat in poll.heartbeats]
        found += [HeartbeatObservation.from_heartbeat(beat, self._nodes.get(beat.rank, ""), subrun, for_node=True)
                  for beat in poll.node_beats]
        return found + list(readings)

    def _exit_of(self, failure: WorkerFailure, subrun: str) -> WorkerExit:
        worker = failure.worker
        node = node_name(worker.node_id) if worker else self._nodes.get(failure.rank, "")
        where = f"pid {worker.pid} on {worker.node_ip}" if worker else "pid unknown"
        output = tuple(printable(line, OUTPUT_LINE_CHARS) for line in failure.output)
        return WorkerExit(failure.rank, node, f"{failure.text} ({where})", failure.time, failure.exit_code, subrun,
                          output)

    def _capacity(self) -> Optional[Capacity]:
        if self.cluster is None or self._data_parallel is None:
            return None
        return Capacity(dict(self.cluster.slots_by_node()), self.cluster.data_parallel_sizes, self._data_parallel,
                        self.cluster.ranks_per_replica, self.cluster.replacement_wait_s)

    def _decide(self, incident: Incident, last_step: int) -> Judgement:
        checkpoints = list(self.checkpoints(last_step))
        decision = decide(incident, self.history, self.policy_config, checkpoints, self._capacity(),
                          self.abilities, self._warm_cover(), final_step=self._subrun.final_step)
        decision = held_for_approval(decision, self.policy_config.carries_out)
        if decision.awaits_approval:  # in the policy's history once approved: a declined one never was
            if self._held is None:
                self._held = (incident, decision, checkpoints)
        else:
            self.history = self.history.record(incident, decision, checkpoints)
        return Judgement(incident, decision)

    def declined(self) -> None:
        """A person declined the held remedy: as if it had never been decided (no budget used, no
        sub-run ending), so that what comes next is decided afresh."""
        self._held = None

    def approved(self) -> None:
        """A person approved the held remedy: in the policy's history from now, as carried out."""
        if self._held is not None:
            incident, decision, checkpoints = self._held
            self.history = self.history.record(incident, replace(decision, awaits_approval=False), checkpoints)
            self._held = None


class SubrunMemory:
    """What the judge remembers of the running sub-run for the incidents that need it."""

    def __init__(self, start_step: int = 0, final_step: Optional[int] = None, ranks: int = 0) -> None:
        self.start_step = start_step
        self.final_step = final_step
        self.ranks = ranks
        self.steps_reported = 0
        self.finished: set[int] = set()
        self.ended = False
        self._output: dict[int, deque[str]] = {}
        self.nodes_left_out = 0
        """Nodes whose lines were dropped for ones that printed later."""

    def keep_output(self, lines: Sequence[OutputLine]) -> None:
        for line in lines:
            kept = self._output.pop(line.node, None) or deque(maxlen=LAST_OUTPUT_LINES)
            kept.append(printable(line.text, OUTPUT_LINE_CHARS))
            self._output[line.node] = kept  # re-inserted: the dict's order is the order nodes last printed
        while len(self._output) > LAST_OUTPUT_NODES:  # a few hundred nodes: those that printed last
            del self._output[next(iter(self._output))]
            self.nodes_left_out += 1

    def last_output(self) -> tuple[str, ...]:
        """The last lines of the nodes that printed last (at most LAST_OUTPUT_NODES), oldest
        first, node by node (prefixed ``node N |`` when more than one node printed)."""
        several = len(self._output) > 1 or self.nodes_left_out > 0
        return tuple(f"node {node} | {text}" if several else text
                     for node, lines in sorted(self._output.items()) for text in lines)
