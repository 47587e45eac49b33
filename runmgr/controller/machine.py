"""The controller: a state machine stepped one transition at a time.

It executes; it does not judge. The :class:`Judge` turns what the workers
report into decisions (watcher, then policy); the controller carries them
out — stop the workers, dump stacks, pick the checkpoint, start the next
sub-run with the decision folded into its plan. Every transition goes
through :meth:`Controller._transition`, which checks it is allowed and tells
the observers (logbook, progress, status file, chaos). Tests step it with a
fake worker group.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Protocol, Sequence

from runmgr.controller.group import (
    GroupPoll, WarmRecoveryError, WarmStart, WarmWorkerGroup, WorkerGroup, WorkerInfo,
)
from runmgr.controller.judge import Judge
from runmgr.controller.judgement import Judgement
from runmgr.controller.replacement import NodeReplacement
from runmgr.controller.states import (
    ALLOWED, AwaitingApproval, Failed, Finished, Launching, Restarting, Running, State, Verdict, is_terminal,
)
from runmgr.errors import ClusterError, ClusterLostError, PlanRefusedError
from runmgr.policy.decision import ABORT, Decision
from runmgr.policy.ending import merge_ending
from runmgr.policy.plan_update import next_plan
from runmgr.resume import ResumePoint
from runmgr.watch.observations import DeviceObservation, UploadObservation
from trainer.config import TrainerConfig


class Observer(Protocol):
    """Sees every transition, poll and judgement; must not change the run."""

    def on_transition(self, old: State | None, new: State) -> None:
        """``old`` is None for the initial state."""

    def on_poll(self, state: Running, poll: GroupPoll) -> None:
        """What the workers reported since the last poll."""

    def on_judgement(self, state: Running | Launching, judgement: Judgement) -> None:
        """An incident and the policy's decision on it (a launch that failed, or one seen while running)."""


class SubrunIds:
    """Numbers sub-runs ``<run>.00``, ``<run>.01``, ... from a starting index."""

    def __init__(self, run_number: int, next_index: int) -> None:
        self.run_number = run_number
        self.next_index = next_index

    def take(self) -> str:
        index, self.next_index = self.next_index, self.next_index + 1
        return f"{self.run_number}.{index:02d}"


class TransitionError(RuntimeError):
    """A transition the state machine does not allow: a bug in the controller."""


def no_devices() -> list[DeviceObservation]:
    return []


def no_uploads() -> list[UploadObservation]:
    return []


def no_verdict(subrun: str) -> Verdict | None:
    return None


class Controller:
    """Drives sub-runs until the run finishes or needs a person."""

    def __init__(
        self,
        initial: Launching,
        trainer_config: TrainerConfig,
        make_group: Callable[[], WorkerGroup],
        resume_at: Callable[[int | None, str], ResumePoint],
        judge: Judge,
        subrun_ids: SubrunIds,
        poll_interval_s: float,
        observers: Sequence[Observer] = (),
        read_devices: Callable[[], list[DeviceObservation]] = no_devices,
        read_uploads: Callable[[], list[UploadObservation]] = no_uploads,
        dump_stacks: Callable[[str, Sequence[WorkerInfo]], None] = lambda subrun, workers: None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        nodes: NodeReplacement | None = None,
        verdicts: Callable[[str], Verdict | None] = no_verdict,
    ) -> None:
        """``make_group()`` builds an empty group that places a sub-run's ranks as its
        plan says (data-parallel size, nodes to avoid); ``resume_at(step, why)`` finds
        the newest verified checkpoint at or before that step (None: from initialisation);
        ``read_devices()`` and ``read_uploads()`` the device poll's readings and the S3
        mirror's attempts since the last call, read after the observers saw the poll;
        ``nodes``: the cluster's replacement of excluded nodes (None: it replaces none, and
        the judge's capacity says so, so no decision asks for one); ``verdicts(subrun)``: a person's
        answer to the remedy ``subrun`` holds for approval, once (None: none yet)."""
        self.state: State = initial
        self.trainer_config = trainer_config
        self.make_group = make_group
        self.resume_at = resume_at
        self.judge = judge
        self.subrun_ids = subrun_ids
        self.poll_interval_s = poll_interval_s
        self.observers = list(observers)
        self.read_devices = read_devices
        self.read_uploads = read_uploads
        self.dump_stacks = dump_stacks
        self.clock = clock
        self.sleep = sleep
        self.nodes = nodes
        self.verdicts = verdicts
        self.last_step = initial.start_step
        self._group: WorkerGroup | None = None
        self._finished_ranks: set[int] = set()

    def run(self) -> State:
        """Announce the initial state, then step until a terminal state;
        always leaves no worker behind."""
        for observer in self.observers:
            observer.on_transition(None, self.state)
        try:
            while not is_terminal(self.state):
                self.step()
        finally:
            self._stop_group()
        return self.state

    def step(self) -> State:
        """Perform one transition (or one poll while running)."""
        handlers = {Launching: self._launch, Running: self._watch, AwaitingApproval: self._watch,
                    Restarting: self._restart}
        new = handlers[type(self.state)](self.state)
        if new is not self.state:
            self._transition(new)
        return self.state

    def _transition(self, new: State) -> None:
        if type(new) not in ALLOWED[type(self.state)]:
            raise TransitionError(f"{type(self.state).__name__} -> {type(new).__name__} is not allowed")
        old, self.state = self.state, new
        for observer in self.observers:
            observer.on_transition(old, new)

    def _launch(self, state: Launching) -> State:
        self.last_step = state.start_step
        self._finished_ranks = set()
        if state.warm is not None:
            return self._recover(state, state.warm)
        self._group = self.make_group()
        try:
            workers = self._group.start(self.trainer_config, state.plan)
        except ClusterLostError as exc:  # no retry can place ranks on a cluster without its head
            self._stop_group()
            return Failed(state.subrun, str(exc), self.last_step)
        except PlanRefusedError as exc:  # the same plan is refused the same way on any retry
            self._stop_group()
            return Failed(state.subrun, f"sub-run {state.subrun} cannot start: {exc}. A human must change the "
                                        f"job's arguments or the policy", self.last_step)
        except ClusterError as exc:
            self._stop_group()
            return self._launch_failed(state, str(exc))
        return self._running(state, workers)

    def _recover(self, state: Launching, warm: WarmStart) -> State:
        """A warm restart: the group that ran the previous sub-run replaces the lost ranks."""
        group = self._group
        if not isinstance(group, WarmWorkerGroup):  # the policy saw a cover: only such a group gives one
            raise TransitionError(f"sub-run {state.subrun} restarts warm without a group that keeps warm state")
        try:
            workers = group.recover(self.trainer_config, state.plan, warm)
        except (WarmRecoveryError, ClusterError) as exc:
            self._stop_group()
            return self._launch_failed(state, str(exc), warm=True)
        return self._running(state, workers)

    def _running(self, state: Launching, workers: list[WorkerInfo]) -> Running:
        group = self._group
        self.judge.start_subrun(workers, group.warm_cover if isinstance(group, WarmWorkerGroup) else None,
                                start_step=state.start_step, final_step=self.trainer_config.training.train_iters)
        return Running(state.subrun, state.plan, state.start_step, tuple(workers))

    def _launch_failed(self, state: Launching, error: str, warm: bool = False) -> State:
        """The policy decides on a launch that failed like on any incident (retry, resize, or a
        human); a failed warm restart is followed by a cold one."""
        judgement = self.judge.launch_failed(state.subrun, error, self.clock(), self.last_step,
                                             state.plan.data_parallel_size, warm)
        for observer in self.observers:
            observer.on_judgement(state, judgement)
        if judgement.decision.action == ABORT:
            return Failed(state.subrun, judgement.decision.reason, self.last_step)
        return Restarting(state.subrun, state.plan, judgement, self.last_step)

    def _watch(self, state: Running | AwaitingApproval) -> State:
        assert self._group is not None
        try:
            poll = self._group.poll(self.poll_interval_s)
        except ClusterLostError as exc:
            self._stop_group()
            return Failed(state.subrun, str(exc), self.last_step)
        if poll.steps:
            self.last_step = max(self.last_step, poll.steps[-1].step)
        if poll.checkpoints:  # a job that skips iterations reports no step for them, but saves
            self.last_step = max(self.last_step, max(c.step for c in poll.checkpoints))
        for observer in self.observers:
            observer.on_poll(state, poll)
        readings = [*poll.devices, *self.read_devices(), *self.read_uploads()]
        judgements = self.judge.judge(state.subrun, poll, readings, self.clock(), self.last_step)
        for judgement in judgements:
            for observer in self.observers:
                observer.on_judgement(state, judgement)
        ending = [j for j in judgements if j.ends_subrun]
        if ending:
            return self._end_subrun(state, ending)
        held = next((j for j in judgements if j.awaits_approval), None)
        if held is not None and isinstance(state, Running):  # the ranks go on while a person decides
            return AwaitingApproval(state.subrun, state.plan, state.start_step, state.workers, held)
        if poll.failures:
            self._stop_group()
            texts = "; ".join(f"rank {f.rank}: {f.text.splitlines()[-1] if f.text else f.kind}" for f in poll.failures)
            return Failed(state.subrun, f"workers failed and the policy chose no restart ({texts}); "
                                        f"see `runmgr logbook show` for the incidents", self.last_step)
        self._finished_ranks |= set(poll.finished_ranks)
        if state.workers and len(self._finished_ranks) >= len(state.workers):
            self._stop_group()
            return Finished(state.subrun, self.last_step)
        if isinstance(state, AwaitingApproval):
            return self._answered(state, self.verdicts(state.subrun))
        return state

    def _answered(self, state: AwaitingApproval, verdict: Verdict | None) -> State:
        """A person's answer to the held remedy: carried out as decided, or the run goes on."""
        if verdict is None:
            return state
        if not verdict.approved:
            self.judge.declined()
            return Running(state.subrun, state.plan, state.start_step, state.workers, declined=verdict)
        self.judge.approved()
        decision = replace(state.judgement.decision, awaits_approval=False)
        return self._end_subrun(state, [replace(state.judgement, decision=decision)], approval=verdict)

    def _end_subrun(self, state: Running | AwaitingApproval, ending: list[Judgement],
                    approval: Verdict | None = None) -> State:
        """Carry out what the decisions that end the sub-run amount to (the policy's
        :func:`merge_ending`): stacks, stopping the ranks, then a person or the next sub-run."""
        merged = merge_ending([j.decision for j in ending])
        judgement = ending[merged.chosen]
        if merged.dump_stacks:
            self.dump_stacks(state.subrun, state.workers)
        if merged.stop_group:
            self._stop_group()
        if judgement.decision.action == ABORT:
            return Failed(state.subrun, judgement.decision.reason, self.last_step)
        return Restarting(state.subrun, state.plan, judgement, self.last_step, merged.also_exclude,
                          merged.also_resize, approval)

    def _restart(self, state: Restarting) -> State:
        decision = state.judgement.decision
        if decision.warm and self._group is not None:
            return self._warm_launching(state)
        if decision.wait_s > 0:
            self.sleep(decision.wait_s)
        point = self._resume_point(state)
        subrun = self.subrun_ids.take()
        plan = next_plan(state.plan, decision, subrun, point.path, state.also_exclude, state.also_resize)
        replaced = self._replace_nodes(decision, plan.avoid_nodes)
        evidence = {
            **replaced,
            "incident": state.judgement.incident.to_dict(), "decision": decision.to_dict(),
            "resumed_from": point.path, "resumed_step": point.step, "last_step": state.last_step,
            "steps_lost": max(0, state.last_step - point.step),
            "rejected_checkpoints": [list(r) for r in point.rejected],
            "excluded_nodes": list(plan.avoid_nodes), "restart": "cold",
            **({"fetched_from": point.fetched_from} if point.fetched_from else {}),
        }
        return Launching(subrun, plan, point.step, state.judgement.incident.summary(), evidence)

    def _replace_nodes(self, decision: Decision, avoid: Sequence[str]) -> dict:
        """Ask the cluster for the replacements the decision names and wait for the room it
        awaits (only when a request went through); what happened, for the next start's evidence."""
        if not decision.replace_nodes:
            return {}
        if self.nodes is None:
            raise TransitionError(f"the decision replaces {', '.join(decision.replace_nodes)} on a cluster "
                                  f"that replaces no node")
        requests = self.nodes.replace(decision.replace_nodes, decision.reason)
        evidence: dict = {"replacements": [r.to_dict() for r in requests]}
        if decision.await_ranks and any(r.requested for r in requests):
            evidence["replacement_wait"] = self.nodes.await_ranks(
                decision.await_ranks, decision.await_timeout_s, avoid).to_dict()
        return evidence

    def _warm_launching(self, state: Restarting) -> Launching:
        """The next sub-run of a warm decision: same ranks but the replaced ones, from the
        snapshot step in memory (no checkpoint is read)."""
        decision = state.judgement.decision
        # Never past the last step recorded: a resume beyond it would leave steps with no metrics.
        snapshot = decision.restart_from_step if decision.restart_from_step is not None else state.last_step
        step = min(snapshot, state.last_step)
        subrun = self.subrun_ids.take()
        plan = next_plan(state.plan, decision, subrun, None)
        evidence = {
            "incident": state.judgement.incident.to_dict(), "decision": decision.to_dict(), "restart": "warm",
            "resumed_from": "memory", "resumed_step": step, "last_step": state.last_step,
            "steps_lost": max(0, state.last_step - step), "replaced_ranks": list(decision.replace_ranks),
            "rejected_checkpoints": [], "excluded_nodes": list(plan.avoid_nodes),
        }
        warm = WarmStart(step, decision.replace_ranks, plan.avoid_nodes)
        return Launching(subrun, plan, step, state.judgement.incident.summary(), evidence, warm)

    def _resume_point(self, state: Restarting) -> ResumePoint:
        """The checkpoint the decision names: the one at its step (an instability's
        rollback target, a margin before the onset), or, when it asks for the newest
        at restart time (a fault: one finished after the decision counts), the newest
        verified one up to the last step the driver recorded. One that no longer
        verifies is passed over for the previous one, with the reason recorded."""
        decision, incident = state.judgement.decision, state.judgement.incident
        # A warm decision the controller carries out cold (its group stopped for another incident
        # of the same poll) starts where a fault's cold restart does.
        if decision.restart_point in ("newest_at_restart", "memory"):
            return self.resume_at(state.last_step, "the last step the driver recorded")
        where = f" at step {incident.onset_step}" if incident.onset_step is not None else ""
        return self.resume_at(decision.restart_from_step,
                              f"the checkpoint {decision.action} names for the {incident.kind}{where}")

    def _stop_group(self) -> None:
        if self._group is not None:
            group, self._group = self._group, None
            group.shutdown()
