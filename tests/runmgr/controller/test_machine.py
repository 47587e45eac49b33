"""Step the controller one transition at a time with a fake worker group and
queued polls (Ray Train v2's controller tests in spirit)."""

from __future__ import annotations

from collections import deque

import pytest

from runmgr.controller.machine import Controller, SubrunIds, TransitionError
from runmgr.resume import ResumePoint
from runmgr.controller.states import Failed, Finished, Launching, Restarting, Running
from runmgr.errors import ClusterError
from runmgr.workers.actor import WorkerInfo
from runmgr.workers.group import GroupPoll, WorkerFailure
from trainer.config import TrainerConfig
from trainer.plan import ResumePlan, SkipRange
from trainer.report import StepReport


def step_report(step: int) -> StepReport:
    return StepReport("1.00", step, 2.0, 1.0, 1e-3, 1.0, 512, step * 8, 0.1, (0.05, 0.05), False, float(step))


class FakeGroup:
    """Plays back queued polls; records what the controller asked of it."""

    def __init__(self, polls: list[GroupPoll], fail_start: bool = False) -> None:
        self.polls = deque(polls)
        self.fail_start = fail_start
        self.started_with: ResumePlan | None = None
        self.shut_down = False

    def start(self, config: TrainerConfig, plan: ResumePlan) -> list[WorkerInfo]:
        if self.fail_start:
            raise ClusterError("no room")
        self.started_with = plan
        return [WorkerInfo(r, 100 + r, "node", "127.0.0.1") for r in range(2)]

    def poll(self, timeout_s: float) -> GroupPoll:
        return self.polls.popleft() if self.polls else GroupPoll()

    def shutdown(self) -> None:
        self.shut_down = True


class Recorder:
    def __init__(self) -> None:
        self.transitions: list[tuple[str, str]] = []
        self.polls = 0

    def on_transition(self, old, new) -> None:
        self.transitions.append((type(old).__name__ if old else "-", type(new).__name__))

    def on_poll(self, state, poll) -> None:
        self.polls += 1


def make_controller(groups: list[FakeGroup], point: ResumePoint, max_restarts: int = 3,
                    plan: ResumePlan | None = None) -> tuple[Controller, Recorder]:
    queue = deque(groups)
    recorder = Recorder()
    plan = plan or ResumePlan(subrun="1.00")
    controller = Controller(
        Launching("1.00", plan, 0, "launch"), TrainerConfig(), make_group=queue.popleft,
        find_resume_point=lambda max_step: point, subrun_ids=SubrunIds(1, 1), max_restarts=max_restarts,
        poll_interval_s=0.0, observers=[recorder],
    )
    return controller, recorder


def died(rank: int, step_text: str = "actor died") -> WorkerFailure:
    return WorkerFailure(rank, "died", step_text, WorkerInfo(rank, 100 + rank, "node", "127.0.0.1"), 0.0)


def test_a_clean_run_goes_launching_running_finished():
    group = FakeGroup([GroupPoll(steps=[step_report(1), step_report(2)]), GroupPoll(finished_ranks=[0, 1])])
    controller, recorder = make_controller([group], ResumePoint(None, 0))
    assert isinstance(controller.step(), Running)
    assert isinstance(controller.step(), Running)  # a poll with steps stays running
    assert controller.last_step == 2
    final = controller.step()
    assert final == Finished("1.00", 2)
    assert group.shut_down
    assert recorder.transitions == [("Launching", "Running"), ("Running", "Finished")]


def test_finishing_needs_every_rank():
    group = FakeGroup([GroupPoll(finished_ranks=[1]), GroupPoll(finished_ranks=[0])])
    controller, _ = make_controller([group], ResumePoint(None, 0))
    controller.step()
    assert isinstance(controller.step(), Running)
    assert isinstance(controller.step(), Finished)


def test_a_lost_worker_restarts_from_the_last_verified_checkpoint_keeping_the_plan():
    skip = (SkipRange(100, 200),)
    first = FakeGroup([GroupPoll(steps=[step_report(27)], failures=[died(1)])])
    second = FakeGroup([GroupPoll(finished_ranks=[0, 1])])
    point = ResumePoint("/ck/step_00000020", 20, (("/ck/step_00000025", "manifest missing"),))
    controller, recorder = make_controller([first, second], point, plan=ResumePlan(subrun="1.00", skip_ranges=skip, lr_scale=0.5))
    controller.step()
    restarting = controller.step()
    assert isinstance(restarting, Restarting)
    assert first.shut_down
    assert "rank 1" in restarting.incident and "step 27" in restarting.incident
    launching = controller.step()
    assert isinstance(launching, Launching)
    assert launching.subrun == "1.01" and launching.start_step == 20
    assert launching.plan.start_checkpoint == "/ck/step_00000020"
    assert launching.plan.skip_ranges == skip and launching.plan.lr_scale == 0.5  # remedies survive a restart
    assert launching.evidence["steps_lost"] == 7
    assert launching.evidence["rejected_checkpoints"] == [["/ck/step_00000025", "manifest missing"]]
    controller.step()
    assert second.started_with == launching.plan
    assert isinstance(controller.step(), Finished)
    assert [t for _, t in recorder.transitions] == ["Running", "Restarting", "Launching", "Running", "Finished"]


def test_the_restart_budget_stops_the_run_with_a_reason():
    groups = [FakeGroup([GroupPoll(failures=[died(0)])]) for _ in range(3)]
    controller, _ = make_controller(groups, ResumePoint("/ck/step_00000010", 10), max_restarts=2)
    final = controller.run()
    assert isinstance(final, Failed)
    assert "restart budget exhausted" in final.reason and "2 of 2" in final.reason
    assert all(g.shut_down for g in groups)


def test_a_cluster_that_cannot_place_the_workers_fails_the_launch():
    controller, _ = make_controller([FakeGroup([], fail_start=True)], ResumePoint(None, 0))
    final = controller.step()
    assert isinstance(final, Failed) and "no room" in final.reason


def test_illegal_transitions_are_refused():
    controller, _ = make_controller([FakeGroup([])], ResumePoint(None, 0))
    with pytest.raises(TransitionError):
        controller._transition(Finished("1.00", 0))


def test_root_cause_prefers_the_dead_process_over_the_peer_echo():
    from runmgr.workers.group import root_cause

    echo = WorkerFailure(0, "error", "RuntimeError: [gloo] Connection closed by peer", None, 1.0)
    dead = WorkerFailure(1, "died", "actor died", None, 2.0)
    assert root_cause([echo, dead]) is dead
