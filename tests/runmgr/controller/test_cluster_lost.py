"""A Ray cluster whose head is gone ends the run at once, as failed with the
group's one line: no retry can place ranks on it, and Ray would end the driver
itself after 60 s with nothing recorded."""

from __future__ import annotations

from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Failed, Launching, Restarting, Running
from runmgr.errors import ClusterLostError
from runmgr.resume import ResumePoint
from tests.runmgr.controller.fakes import FakeGroup, died, make_controller, step_report

LOST = "the Ray cluster's head is gone: its GCS process (pid 42) was killed by signal 9"


class HeadlessGroup(FakeGroup):
    """Plays back its polls, then finds the head gone; with ``at_start`` already when starting."""

    def __init__(self, polls: list[GroupPoll], at_start: bool = False) -> None:
        super().__init__(polls)
        self.at_start = at_start

    def start(self, config, plan):
        if self.at_start:
            self.started_with = plan
            raise ClusterLostError(LOST)
        return super().start(config, plan)

    def poll(self, timeout_s: float) -> GroupPoll:
        if self.polls:
            return self.polls.popleft()
        raise ClusterLostError(LOST)


def test_a_head_lost_while_training_fails_the_subrun_at_its_last_step_with_the_groups_line():
    group = HeadlessGroup([GroupPoll(steps=[step_report(14), step_report(15)])])
    controller, recorder = make_controller([group])
    assert isinstance(controller.step(), Running)
    assert isinstance(controller.step(), Running)
    assert controller.step() == Failed("1.00", LOST, 15)
    assert group.shut_down
    assert recorder.judgements == []  # nothing to judge: the policy's retries cannot help


def test_a_restart_whose_start_finds_the_head_gone_fails_instead_of_retrying_the_launch():
    first = FakeGroup([GroupPoll(steps=[step_report(27)], failures=[died(1)])])
    second = HeadlessGroup([], at_start=True)
    controller, recorder = make_controller([first, second], {27: ResumePoint("/ck/step_00000020", 20)})
    controller.step()
    assert isinstance(controller.step(), Restarting)
    assert isinstance(controller.step(), Launching)
    assert controller.step() == Failed("1.01", LOST, 20)
    assert second.started_with is not None and second.shut_down
    assert recorder.slept == []  # no wait for a launch retry
    assert recorder.transitions[-1] == ("Launching", "Failed")
