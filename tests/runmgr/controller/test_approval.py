"""``policy.act_on``: a remedy runmgr may not take by itself is held for a person while the ranks
go on; approved, it is carried out as decided; declined, the run goes on as if it had not been
decided. The controller stepped over fake groups with the real judge and policy."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runmgr.config.policy import PolicyConfig
from runmgr.controller.group import GroupPoll
from runmgr.controller.states import AwaitingApproval, Launching, Restarting, Running, Verdict
from runmgr.resume import ResumePoint
from tests.runmgr.controller.fakes import FakeGroup, died, make_controller, step_report

RESTART_ONLY = ["restart"]


def spiking(policy: PolicyConfig, after_spike: list[GroupPoll]):
    """A loss that jumps from 2 to 6 at step 121 and stays there, a poll per step, then ``after_spike``."""
    healthy = [step_report(s, 2.0 + 0.01 * (s % 3)) for s in range(1, 121)]
    spike = [GroupPoll(steps=[step_report(s, 6.0)]) for s in range(121, 200)]
    first, second = FakeGroup([GroupPoll(steps=healthy), *spike, *after_spike]), FakeGroup([])
    controller, recorder = make_controller([first, second], policy=policy,
                                           points={20: ResumePoint("/ck/step_00000020", 20),
                                                   100: ResumePoint("/ck/step_00000100", 100)},
                                           train_iters=1000)
    answers: list = []
    controller.verdicts = lambda subrun: answers.pop(0) if answers else None
    return controller, recorder, first, answers


def until(controller, kind):
    while not isinstance(controller.state, kind):
        controller.step()
    return controller.state


def held_policy(act_on=RESTART_ONLY) -> PolicyConfig:
    policy = PolicyConfig(act_on=list(act_on))
    return replace(policy, rollback=replace(policy.rollback, margin_steps=100, skip_before_steps=5, skip_after_steps=10))


def test_a_spike_s_rollback_is_held_while_the_ranks_train_then_carried_out_once_approved():
    controller, recorder, first, answers = spiking(held_policy(), [])
    held = until(controller, AwaitingApproval)
    decision = held.judgement.decision
    assert decision.action == "rollback_skip" and decision.awaits_approval and "held for a person" in decision.reason
    assert not first.shut_down  # the ranks go on while a person decides
    step_before = controller.last_step
    controller.step()
    assert isinstance(controller.state, AwaitingApproval) and controller.last_step == step_before + 1
    answers.append(Verdict(True, "alice", 5.0))
    restarting = controller.step()
    assert isinstance(restarting, Restarting) and restarting.approval == Verdict(True, "alice", 5.0)
    assert first.shut_down
    launching = controller.step()
    assert isinstance(launching, Launching) and launching.start_step == 20 and launching.plan.skip_ranges
    # Approved, it counts as carried out: the ladder's next instability is its next rung.
    assert controller.judge.history.entries[-1].decision.action == "rollback_skip"


def test_a_declined_remedy_is_as_if_never_decided_and_a_later_death_is_restarted_by_runmgr_itself():
    controller, recorder, first, answers = spiking(held_policy(), [GroupPoll(failures=[died(1)])])
    until(controller, AwaitingApproval)
    answers.append(Verdict(False, "bob", 6.0))
    running = controller.step()
    assert isinstance(running, Running) and running.declined == Verdict(False, "bob", 6.0) and not first.shut_down
    assert not controller.judge.history.entries  # no budget used, no sub-run ending
    restarting = until(controller, Restarting)
    assert restarting.judgement.incident.kind == "worker_death" and restarting.judgement.decision.action == "restart"
    assert restarting.approval is None  # act_on names restart: no person was asked


def test_with_every_remedy_acted_on_nothing_is_held():
    controller, recorder, first, answers = spiking(held_policy(["all"]), [])
    restarting = until(controller, Restarting)
    assert restarting.judgement.decision.action == "rollback_skip" and not restarting.judgement.decision.awaits_approval
    assert ("Running", "AwaitingApproval") not in recorder.transitions


def test_act_on_names_only_remedies():
    from runmgr.config.compose import load_run_config
    from runmgr.errors import ConfigError

    with pytest.raises(ConfigError, match="policy.act_on: 'reboot' is no remedy"):
        load_run_config("demo", ["policy.act_on=[restart,reboot]", "run.dir=/tmp/x"])


def test_a_launch_that_failed_is_retried_without_asking_whatever_act_on_says():
    first, second = FakeGroup([], fail_start=True), FakeGroup([GroupPoll(steps=[step_report(1)],
                                                                         finished_ranks=[0, 1])])
    controller, recorder = make_controller([first, second], policy=held_policy())
    restarting = until(controller, Restarting)
    assert restarting.judgement.decision.action == "retry_launch" and not restarting.judgement.awaits_approval
    assert controller.judge.history.entries  # counted against its budget: a failing launch ends
