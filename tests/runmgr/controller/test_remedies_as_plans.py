"""Every remedy is a decision and a plan: the nodes to avoid and the data-parallel
size travel in the ResumePlan, a shrink is the policy's decision, the checkpoint a
restart uses is the one its decision names, and a launch that fails goes through
a policy rung with its own budget. The controller is stepped over fake groups."""

from __future__ import annotations

from dataclasses import replace

from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Failed, Launching, Restarting, Running
from runmgr.config.policy import PolicyConfig
from runmgr.resume import ResumePoint
from runmgr.watch.observations import DeviceObservation
from tests.runmgr.controller.fakes import FakeGroup, died, make_controller, step_report
from trainer.plan import ResumePlan

ECC_ON_NODE1 = [DeviceObservation("node1", 0, "ecc", 2000.0, correctable=0, uncorrectable=2)]


def run_until_restart(controller) -> Restarting:
    controller.step()
    while isinstance(controller.state, Running):
        controller.step()
    assert isinstance(controller.state, Restarting), controller.state
    return controller.state


def ecc_controller(slots: dict[str, int]):
    first = FakeGroup([GroupPoll(steps=[step_report(25)])])
    second = FakeGroup([GroupPoll(finished_ranks=[0, 1])])
    controller, recorder = make_controller([first, second], points={25: ResumePoint("/ck/step_00000020", 20)},
                                           slots=slots)
    controller.read_devices = lambda: ECC_ON_NODE1
    return controller, recorder, second


def test_an_excluded_node_with_a_spare_keeps_data_parallel_and_goes_into_the_plan():
    controller, _, second = ecc_controller({"node0": 1, "node1": 1, "node2": 1})
    decision = run_until_restart(controller).judgement.decision
    assert decision.action == "exclude_node" and decision.exclude_nodes == ("node1",)
    assert decision.data_parallel_size == 2 and "shrinks" not in decision.reason
    launching = controller.step()
    assert launching.plan.avoid_nodes == ("node1",) and launching.plan.data_parallel_size == 2
    controller.step()
    assert second.started_with.avoid_nodes == ("node1",)


def test_without_a_spare_the_shrink_is_the_policy_s_decision_with_its_reason():
    controller, recorder, second = ecc_controller({"node0": 1, "node1": 1})
    decision = run_until_restart(controller).judgement.decision
    assert decision.action == "exclude_node" and decision.data_parallel_size == 1
    assert "data parallel shrinks 2 -> 1: the nodes left hold 1 rank(s)" in decision.reason
    launching = controller.step()
    assert launching.plan.data_parallel_size == 1 and launching.plan.avoid_nodes == ("node1",)
    assert launching.evidence["decision"]["data_parallel_size"] == 1
    controller.step()
    assert second.started_with.data_parallel_size == 1  # the group carries the plan out, it decides nothing


def test_a_plan_alone_replays_the_placement():
    controller, _, _ = ecc_controller({"node0": 1, "node1": 1})
    run_until_restart(controller)
    plan = controller.step().plan
    again = ResumePlan.from_json(plan.to_json())
    assert again == plan and again.avoid_nodes == ("node1",) and again.data_parallel_size == 1


def test_nodes_to_avoid_accumulate_over_the_lineage():
    controller, _, _ = ecc_controller({"node0": 1, "node1": 1, "node2": 1})
    controller.state = replace(controller.state, plan=ResumePlan(subrun="1.00", data_parallel_size=2,
                                                                 avoid_nodes=("node9",)))
    run_until_restart(controller)
    assert controller.step().plan.avoid_nodes == ("node9", "node1")


def test_a_fault_restart_uses_the_newest_checkpoint_at_restart_time_and_says_so():
    asked = []
    first = FakeGroup([GroupPoll(steps=[step_report(27)], failures=[died(1)])])
    controller, _ = make_controller([first, FakeGroup([])], points={27: ResumePoint("/ck/step_00000025", 25)})
    inner = controller.resume_at
    controller.resume_at = lambda step, why: asked.append(step) or inner(step, why)
    decision = run_until_restart(controller).judgement.decision
    assert decision.restart_point == "newest_at_restart" and decision.restart_from_step == 20
    assert "the newest verified checkpoint at restart time (step 20 now)" in decision.reason
    launching = controller.step()
    # a checkpoint that finished after the decision (25) is used, as the decision asked
    assert asked == [27] and launching.start_step == 25


def test_a_rollback_uses_exactly_the_checkpoint_its_decision_names():
    asked = []
    healthy = [step_report(s, 2.0 + 0.01 * (s % 3)) for s in range(1, 121)]
    spiking = [GroupPoll(steps=[step_report(s, 6.0)]) for s in range(121, 200)]
    policy = PolicyConfig()
    policy = replace(policy, rollback=replace(policy.rollback, margin_steps=100))
    controller, _ = make_controller([FakeGroup([GroupPoll(steps=healthy), *spiking]), FakeGroup([])], policy=policy)
    inner = controller.resume_at
    controller.resume_at = lambda step, why: asked.append(step) or inner(step, why)
    decision = run_until_restart(controller).judgement.decision
    assert decision.restart_point == "step" and decision.restart_from_step == 20
    launching = controller.step()
    assert asked == [20] and launching.plan.start_checkpoint == "/ck/step_00000020"


def test_a_failed_launch_is_retried_after_the_wait_within_its_own_budget():
    groups = [FakeGroup([], fail_start=True) for _ in range(4)]
    controller, recorder = make_controller(groups)
    restarting = controller.step()
    assert isinstance(restarting, Restarting)
    decision = restarting.judgement.decision
    assert restarting.judgement.incident.kind == "launch_failure" and decision.action == "retry_launch"
    assert decision.wait_s == 30.0 and "retry 1 of 3" in decision.reason and "no room" in decision.reason
    launching = controller.step()
    assert recorder.slept == [30.0] and isinstance(launching, Launching) and launching.subrun == "1.01"
    final = controller.run()
    assert isinstance(final, Failed) and "launch-retry budget is spent (3 of 3)" in final.reason
    assert [j.decision.action for j in recorder.judgements] == ["retry_launch"] * 3 + ["abort"]
    assert controller.judge.history.fault_restarts() == 0  # the restart budget is untouched


def test_a_failed_launch_on_fewer_nodes_shrinks_at_once():
    groups = [FakeGroup([], fail_start=True), FakeGroup([GroupPoll(finished_ranks=[0])])]
    controller, recorder = make_controller(groups, slots={"node0": 1})
    decision = controller.step().judgement.decision
    assert decision.action == "retry_launch" and decision.wait_s == 0 and decision.data_parallel_size == 1
    assert "data parallel shrinks 2 -> 1" in decision.reason
    launching = controller.step()
    assert recorder.slept == [] and launching.plan.data_parallel_size == 1


def test_a_deterministic_startup_error_needs_a_person_after_one_try():
    text = ("ray::TrainerWorker.run()\n  File \"trainer/loop.py\", line 79, in check_config\n"
            "trainer.errors.TrainerConfigError: the plan of sub-run 1.00 asks for data parallel 4, but 2 ranks "
            "were started")
    first = FakeGroup([GroupPoll(failures=[replace(died(0), kind="error", text=text)])])
    controller, recorder = make_controller([first, FakeGroup([])])
    final = controller.run()
    assert isinstance(final, Failed) and "a config failure does not go away by restarting" in final.reason
    assert [j.decision.action for j in recorder.judgements] == ["abort"]
