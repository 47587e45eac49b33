"""A fake worker group and queued polls to step the controller with (Ray Train
v2's controller tests in spirit). The judge is the real one: real detectors and
the real policy on the queued observations."""

from __future__ import annotations

from collections import deque

from runmgr.controller.group import GroupPoll, WarmRecoveryError, WarmStart, WorkerFailure, WorkerInfo
from runmgr.controller.judge import ClusterSlots, Judge
from runmgr.controller.machine import Controller, SubrunIds
from runmgr.controller.states import Launching
from runmgr.errors import ClusterError
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.policy.warm import WarmCover
from runmgr.config.policy import PolicyConfig
from runmgr.resume import ResumePoint
from runmgr.config.watcher import WatcherConfig
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan
from trainer.report import StepReport

CHECKPOINTS = [VerifiedCheckpoint(10, 80), VerifiedCheckpoint(20, 160)]


def step_report(step: int, loss: float = 2.0, subrun: str = "1.00") -> StepReport:
    return StepReport(subrun, step, loss, 1.0, 1e-3, 1.0, 512, step * 8, 0.1, (0.05, 0.05), False, 1000.0 + step)


class FakeGroup:
    """Plays back queued polls; records what the controller asked of it."""

    def __init__(self, polls: list[GroupPoll], fail_start: bool = False) -> None:
        self.polls = deque(polls)
        self.fail_start = fail_start
        self.started_with: ResumePlan | None = None
        self.shut_down = False

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        self.started_with = plan
        if self.fail_start:
            raise ClusterError("no room")
        return [WorkerInfo(r, 100 + r, f"node{r}", "127.0.0.1") for r in range(plan.data_parallel_size or 2)]

    def poll(self, timeout_s: float) -> GroupPoll:
        return self.polls.popleft() if self.polls else GroupPoll()

    def shutdown(self) -> None:
        self.shut_down = True


class Recorder:
    def __init__(self) -> None:
        self.transitions: list[tuple[str, str]] = []
        self.judgements = []
        self.slept: list[float] = []

    def on_transition(self, old, new) -> None:
        self.transitions.append((type(old).__name__ if old else "-", type(new).__name__))

    def on_poll(self, state, poll) -> None:
        pass

    def on_judgement(self, state, judgement) -> None:
        self.judgements.append(judgement)


def reported_steps(groups: list[FakeGroup]) -> int:
    """The furthest step the queued polls report: where a run of these groups ends."""
    return max((report.step for group in groups for poll in group.polls for report in poll.steps), default=0)


def make_controller(groups: list[FakeGroup], points: dict | None = None, plan: ResumePlan | None = None,
                    policy: PolicyConfig | None = None, slots: dict[str, int] | None = None,
                    observers: tuple = (), train_iters: int | None = None) -> tuple[Controller, Recorder]:
    """A controller over ``groups`` (one per sub-run). ``points``: what ``resume_at(step)``
    finds; ``slots``: the ranks each node can hold (None: no cluster in view); ``train_iters``:
    the run's last step (default: the furthest step the polls report, so that ranks that all
    end there finish the run)."""
    trainer_config = TrainerConfig()
    trainer_config.training.train_iters = train_iters if train_iters is not None else reported_steps(groups)
    queue = deque(groups)
    recorder = Recorder()
    points = points or {20: ResumePoint("/ck/step_00000020", 20), 10: ResumePoint("/ck/step_00000010", 10)}
    cluster = ClusterSlots(lambda: dict(slots), (2, 1)) if slots is not None else None
    judge = Judge(WatcherConfig(), policy or PolicyConfig(), lambda max_step: [c for c in CHECKPOINTS if c.step <= max_step],
                  cluster)
    controller = Controller(
        Launching("1.00", plan or ResumePlan(subrun="1.00", data_parallel_size=2), 0, "launch"), trainer_config,
        make_group=queue.popleft, resume_at=lambda step, why: points.get(step, ResumePoint(None, 0)), judge=judge,
        subrun_ids=SubrunIds(1, 1), poll_interval_s=0.0, observers=[recorder, *observers], clock=lambda: 2000.0,
        sleep=recorder.slept.append,
    )
    return controller, recorder


def died(rank: int) -> WorkerFailure:
    return WorkerFailure(rank, "died", "The actor died unexpectedly before finishing this task.",
                         WorkerInfo(rank, 100 + rank, f"node{rank}", "127.0.0.1"), 0.0)


class FakeWarmGroup(FakeGroup):
    """A group that keeps warm state: its cover says what it could recover; ``recover``
    records the request (or fails with ``recover_error``)."""

    def __init__(self, polls: list[GroupPoll], cover: WarmCover, recover_error: str = "") -> None:
        super().__init__(polls)
        self.cover = cover
        self.recover_error = recover_error
        self.recovered: list[tuple[ResumePlan, WarmStart]] = []

    def warm_cover(self) -> WarmCover:
        return self.cover

    def recover(self, config: TrainerConfig, plan: ResumePlan, warm: WarmStart) -> list[WorkerInfo]:
        if self.recover_error:
            raise WarmRecoveryError(self.recover_error)
        self.recovered.append((plan, warm))
        return [WorkerInfo(r, 200 + r, "node2" if r in warm.ranks else f"node{r}", "127.0.0.1")
                for r in range(plan.data_parallel_size or 2)]
