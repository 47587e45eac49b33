"""Step the controller one transition at a time with a fake worker group and
queued polls (Ray Train v2's controller tests in spirit). The judge is the
real one: real detectors and the real policy on the queued observations."""

from __future__ import annotations

import pytest

from runmgr.controller.group import GroupPoll
from runmgr.nodes import node_name
from runmgr.controller.machine import Controller, TransitionError
from runmgr.controller.states import Failed, Finished, Launching, Restarting, Running
from runmgr.config.policy import PolicyConfig
from runmgr.resume import ResumePoint
from runmgr.watch.observations import DeviceObservation
from tests.runmgr.controller.fakes import FakeGroup, Recorder, died, make_controller, step_report
from trainer.plan import ResumePlan, SkipRange

def test_a_clean_run_goes_launching_running_finished():
    group = FakeGroup([GroupPoll(steps=[step_report(1), step_report(2)]), GroupPoll(finished_ranks=[0, 1])])
    controller, recorder = make_controller([group])
    assert isinstance(controller.step(), Running)
    assert isinstance(controller.step(), Running)  # a poll with steps stays running
    assert controller.last_step == 2
    assert controller.step() == Finished("1.00", 2)
    assert group.shut_down
    assert recorder.transitions == [("Launching", "Running"), ("Running", "Finished")]
    assert recorder.judgements == []


def test_finishing_needs_every_rank():
    controller, _ = make_controller([FakeGroup([GroupPoll(finished_ranks=[1]), GroupPoll(finished_ranks=[0])])])
    controller.step()
    assert isinstance(controller.step(), Running)
    assert isinstance(controller.step(), Finished)


def test_a_killed_worker_restarts_from_the_newest_checkpoint_keeping_the_plan():
    skip = (SkipRange(100, 200),)
    first = FakeGroup([GroupPoll(steps=[step_report(27)], failures=[died(1)])])
    second = FakeGroup([GroupPoll(steps=[step_report(27, subrun="1.01")], finished_ranks=[0, 1])])
    # a fault restarts from the newest verified checkpoint up to the last step recorded (27)
    points = {27: ResumePoint("/ck/step_00000020", 20, (("/ck/step_00000025", "manifest missing"),))}
    controller, recorder = make_controller([first, second], points,
                                           plan=ResumePlan(subrun="1.00", skip_ranges=skip, lr_scale=0.5))
    controller.step()
    restarting = controller.step()
    assert isinstance(restarting, Restarting) and first.shut_down
    judgement = restarting.judgement
    assert judgement.incident.kind == "worker_death" and judgement.incident.ranks == (1,)
    assert judgement.incident.evidence["category"] == "killed"
    assert judgement.decision.action == "restart" and judgement.decision.restart_from_step == 20
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
    policy = PolicyConfig()
    policy = type(policy)(**{**vars(policy), "restarts": type(policy.restarts)(max_restarts=2, storm_restarts=10)})
    groups = [FakeGroup([GroupPoll(steps=[step_report(21, subrun=f"1.0{i}")], failures=[died(0)])]) for i in range(3)]
    controller, _ = make_controller(groups, points={21: ResumePoint("/ck/step_00000020", 20)}, policy=policy)
    final = controller.run()
    assert isinstance(final, Failed)
    assert "restart budget is spent (2 of 2" in final.reason
    assert all(g.shut_down for g in groups)


def spiking_controller(devices=None) -> tuple[Controller, Recorder, FakeGroup, FakeGroup]:
    """A loss that jumps from 2 to 6 at step 121 and stays there, a poll per step."""
    healthy = [step_report(s, 2.0 + 0.01 * (s % 3)) for s in range(1, 121)]
    spiking = [step_report(s, 6.0) for s in range(121, 200)]
    first, second = FakeGroup([GroupPoll(steps=healthy), *[GroupPoll(steps=[r]) for r in spiking]]), FakeGroup([])
    policy = PolicyConfig()
    policy = type(policy)(**{**vars(policy), "rollback": type(policy.rollback)(margin_steps=100, skip_before_steps=5, skip_after_steps=10)})
    controller, recorder = make_controller([first, second], policy=policy,
                                           points={20: ResumePoint("/ck/step_00000020", 20)})
    if devices is not None:
        controller.read_devices = lambda: devices(controller.last_step)
    controller.step()
    while isinstance(controller.state, Running):
        controller.step()
    return controller, recorder, first, second


def test_a_persistent_loss_spike_rolls_back_and_skips_the_data():
    controller, _, first, _ = spiking_controller()
    assert isinstance(controller.state, Restarting)
    decision = controller.state.judgement.decision
    assert decision.action == "rollback_skip" and decision.restart_from_step == 20
    assert first.shut_down
    launching = controller.step()
    assert launching.start_step == 20 and launching.plan.skip_ranges  # the spiking window is skipped
    onset_sample = controller.state.evidence["incident"]["onset_sample"]
    assert any(r.start <= onset_sample < r.end for r in launching.plan.skip_ranges)


def test_a_device_fault_seen_in_the_poll_that_ends_the_subrun_still_excludes_its_node():
    """An ECC error read in the very poll whose spike ends the sub-run: the rollback
    goes ahead, and the node with the bad device is left out of the next sub-run."""
    decided_at = spiking_controller()[0].state.last_step
    bad_node = node_name("node1")
    ecc = [DeviceObservation(bad_node, 0, "ecc", 2000.0, correctable=0, uncorrectable=2)]
    controller, recorder, _, second = spiking_controller(lambda step: ecc if step >= decided_at else [])
    assert [j.decision.action for j in recorder.judgements] == ["rollback_skip", "exclude_node"]
    assert controller.state.judgement.decision.action == "rollback_skip"
    launching = controller.step()
    assert launching.start_step == 20 and launching.plan.skip_ranges  # the rollback still happens
    assert launching.evidence["excluded_nodes"] == [bad_node]
    controller.step()
    assert second.started_with.avoid_nodes == (bad_node,)


def test_illegal_transitions_are_refused():
    controller, _ = make_controller([FakeGroup([])])
    with pytest.raises(TransitionError):
        controller._transition(Finished("1.00", 0))


def test_these_tests_run_with_ray_absent():
    import sys

    assert not [name for name in sys.modules if name == "ray" or name.startswith("ray.")]
    with pytest.raises(ImportError):
        __import__("ray")
