"""The controller carries out a warm decision on the group that ran the sub-run: the
survivors are not stopped, the lost rank is replaced, the next sub-run starts at the
memory snapshot's step; a warm restart that fails is followed by a cold one."""

from __future__ import annotations

from runmgr.controller.group import GroupPoll, WarmStart
from runmgr.controller.states import Launching, Restarting, Running
from runmgr.policy.warm import WarmCover
from runmgr.resume import ResumePoint
from tests.runmgr.controller.fakes import FakeGroup, FakeWarmGroup, died, make_controller, step_report

COVER = WarmCover(snapshot_step=27, rank_nodes={0: "node0", 1: "node1"},
                  holders={0: ("node0", "node1"), 1: ("node1", "node0")}, spares={"node2": 1})


def test_a_killed_rank_is_replaced_warm_and_the_survivor_is_never_stopped():
    group = FakeWarmGroup([GroupPoll(steps=[step_report(27)], failures=[died(1)])], COVER)
    controller, recorder = make_controller([group])
    controller.step()
    restarting = controller.step()
    assert isinstance(restarting, Restarting) and restarting.judgement.decision.warm
    assert not group.shut_down
    launching = controller.step()
    assert isinstance(launching, Launching) and launching.warm == WarmStart(27, (1,), ())
    assert (launching.start_step, launching.evidence["restart"], launching.evidence["steps_lost"]) == (27, "warm", 0)
    assert launching.plan.subrun == "1.01" and launching.plan.start_checkpoint is None
    running = controller.step()
    assert isinstance(running, Running) and running.start_step == 27
    assert [warm for _plan, warm in group.recovered] == [WarmStart(27, (1,), ())]
    assert [w.node_id for w in running.workers] == ["node0", "node2"]
    assert not group.shut_down


def test_a_failed_warm_restart_stops_the_group_and_restarts_cold_from_the_newest_checkpoint():
    warm = FakeWarmGroup([GroupPoll(steps=[step_report(27)], failures=[died(1)])], COVER, recover_error="spare died")
    cold = FakeGroup([])
    # The newest verified checkpoint up to the last step recorded (27) is step 20's.
    controller, recorder = make_controller([warm, cold], points={27: ResumePoint("/ck/step_00000020", 20)})
    for _ in range(3):
        controller.step()
    failed = controller.step()  # the warm Launching -> Restarting, decided by the policy
    assert isinstance(failed, Restarting) and warm.shut_down
    assert failed.judgement.decision.action == "retry_launch" and failed.judgement.decision.wait_s == 0
    assert "warm restart of sub-run 1.01 failed (spare died) -> restart cold now" in failed.judgement.decision.reason
    launching = controller.step()
    assert launching.warm is None and launching.evidence["restart"] == "cold"
    assert (launching.start_step, launching.plan.start_checkpoint) == (20, "/ck/step_00000020")
    assert isinstance(controller.step(), Running) and cold.started_with.subrun == "1.02"
    assert recorder.slept == []
