"""An S3 outage reaches the judge through the controller (the mirror's attempts
are read after each poll) and is decided like any incident: training goes on."""

from __future__ import annotations

from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Finished, Running
from runmgr.watch.observations import UploadObservation
from tests.runmgr.controller.fakes import FakeGroup, make_controller, step_report


def test_an_outage_is_judged_and_recorded_and_the_subrun_trains_on():
    group = FakeGroup([GroupPoll(steps=[step_report(21)]), GroupPoll(steps=[step_report(22)]),
                       GroupPoll(finished_ranks=[0, 1])])
    controller, recorder = make_controller([group])
    attempts = [[UploadObservation(20, 1000.0, ok=False, error="Could not connect", pending_steps=(20,))],
                [UploadObservation(20, 1990.0, ok=True)], []]
    controller.read_uploads = lambda: attempts.pop(0) if attempts else []
    controller.step()
    assert isinstance(controller.step(), Running)  # the outage (1000 s of failures at the controller's now)
    assert isinstance(controller.step(), Running)  # and its end
    assert isinstance(controller.step(), Finished) and not group.polls
    (down, back) = recorder.judgements
    assert (down.incident.kind, down.incident.recovered, down.decision.action) == ("storage_outage", False, "keep_local")
    assert (back.incident.recovered, back.decision.action) == (True, "ignore")
