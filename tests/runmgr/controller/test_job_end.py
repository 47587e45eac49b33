"""How a sub-run ends when its ranks stop by themselves: every rank's exit 0 at the last step
is finished, before it an early exit; a job that hangs before it ever printed a step, and a plan
the trainer cannot carry, stop for a person with the job's own last words."""

from __future__ import annotations

from runmgr.config.policy import PolicyConfig
from runmgr.config.watcher import WatcherConfig
from runmgr.controller.group import GroupPoll, OutputLine, WorkerInfo
from runmgr.controller.judge import Judge
from runmgr.controller.states import Failed, Finished, Restarting
from runmgr.errors import PlanRefusedError
from runmgr.policy.checkpoints import VerifiedCheckpoint
from runmgr.watch.incidents import EARLY_EXIT, HANG
from tests.runmgr.controller.fakes import FakeGroup, make_controller, step_report
from trainer.report import Heartbeat


def run_to_end(controller) -> object:
    state = controller.step()
    while not isinstance(state, (Failed, Finished, Restarting)):
        state = controller.step()
    return state


def test_ranks_that_all_exit_0_at_the_last_step_finish_the_run():
    group = FakeGroup([GroupPoll(steps=[step_report(10)]), GroupPoll(finished_ranks=[0, 1])])
    controller, recorder = make_controller([group], train_iters=10)
    assert run_to_end(controller) == Finished("1.00", 10) and recorder.judgements == []


def test_ranks_that_all_exit_0_before_it_are_an_early_exit_with_their_last_output():
    group = FakeGroup([GroupPoll(steps=[step_report(5)], output=[OutputLine(0, "iteration 5/10 |")]),
                       GroupPoll(finished_ranks=[0, 1], output=[OutputLine(1, "bye")])])
    controller, recorder = make_controller([group], train_iters=10)
    failed = run_to_end(controller)
    assert isinstance(failed, Failed) and failed.last_step == 5
    (judgement,) = recorder.judgements
    assert judgement.incident.kind == EARLY_EXIT and judgement.decision.action == "abort"
    assert judgement.incident.evidence["last_output"] == ["node 0 | iteration 5/10 |", "node 1 | bye"]


def test_one_rank_finishing_early_is_not_the_end_and_is_never_waited_for():
    group = FakeGroup([GroupPoll(steps=[step_report(9)], finished_ranks=[1]), GroupPoll(steps=[step_report(10)]),
                       GroupPoll(finished_ranks=[0])])
    controller, recorder = make_controller([group], train_iters=10)
    assert run_to_end(controller) == Finished("1.00", 10) and recorder.judgements == []


def test_a_plan_the_trainer_cannot_carry_stops_the_run_instead_of_retrying_it():
    class Refusing(FakeGroup):
        def start(self, config, plan):
            raise PlanRefusedError("the plan of sub-run 1.00 scales the LR by 0.67, but the job's arguments give "
                                   "no --lr to scale")

    controller, recorder = make_controller([Refusing([])], train_iters=10)
    failed = controller.step()
    assert isinstance(failed, Failed) and "no --lr to scale" in failed.reason and recorder.judgements == []


def test_a_job_silent_since_its_start_is_a_hang_that_needs_a_person_with_what_it_printed():
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda step: [])
    judge.start_subrun([WorkerInfo(0, 1, "node-a", "127.0.0.1")], start_step=0, final_step=100)
    started = GroupPoll(heartbeats=[Heartbeat(0, "init", 0, 0.0)], output=[OutputLine(0, "> building GPT model")])
    assert judge.judge("1.00", started, [], now=1.0, last_step=0) == []
    (judgement,) = judge.judge("1.00", GroupPoll(), [], now=WatcherConfig().hang.init.initial_s + 1, last_step=0)
    assert judgement.incident.kind == HANG and judgement.incident.evidence["never_stepped"] is True
    assert judgement.incident.evidence["last_output"] == ["> building GPT model"]
    assert judgement.decision.action == "abort" and judgement.decision.dump_stacks


def test_the_same_hang_after_the_lineage_trained_is_dumped_and_restarted():
    judge = Judge(WatcherConfig(), PolicyConfig(), lambda step: [VerifiedCheckpoint(20, 160)])
    judge.start_subrun([WorkerInfo(0, 1, "node-a", "127.0.0.1")], start_step=0, final_step=100)
    judge.judge("1.00", GroupPoll(steps=[step_report(20)]), [], now=1.0, last_step=20)
    judge.start_subrun([WorkerInfo(0, 1, "node-a", "127.0.0.1")], start_step=20, final_step=100)
    judge.judge("1.01", GroupPoll(heartbeats=[Heartbeat(0, "init", 20, 2.0)]), [], now=2.0, last_step=20)
    (judgement,) = judge.judge("1.01", GroupPoll(), [], now=2.0 + WatcherConfig().hang.init.initial_s + 1,
                               last_step=20)
    assert judgement.incident.evidence["never_stepped"] is False
    assert judgement.decision.action == "dump_and_restart"




def test_at_hundreds_of_nodes_an_incident_keeps_the_nodes_that_printed_last():
    from runmgr.controller.judge import LAST_OUTPUT_LINES, LAST_OUTPUT_NODES

    judge = Judge(WatcherConfig(), PolicyConfig(), lambda step: [])
    judge.start_subrun([WorkerInfo(rank, 1, f"node-{rank}", "127.0.0.1") for rank in range(300)], start_step=0,
                       final_step=100)
    chatter = [OutputLine(node, f"line {n} of node {node}") for n in range(30) for node in range(300)]
    judge.judge("1.00", GroupPoll(heartbeats=[Heartbeat(0, "init", 0, 0.0)], output=chatter), [], now=1.0, last_step=0)
    (judgement,) = judge.judge("1.00", GroupPoll(), [], now=WatcherConfig().hang.init.initial_s + 2, last_step=0)
    kept = judgement.incident.evidence["last_output"]
    assert len(kept) == LAST_OUTPUT_NODES * LAST_OUTPUT_LINES
    assert {line.split(" | ")[0] for line in kept} == {f"node {n}" for n in range(300 - LAST_OUTPUT_NODES, 300)}
    assert judgement.incident.evidence["last_output_nodes_left_out"] == 300 - LAST_OUTPUT_NODES
