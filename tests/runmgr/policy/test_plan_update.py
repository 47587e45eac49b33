"""Decisions folded into the next resume plan."""

from __future__ import annotations

import pytest
from trainer.plan import ResumePlan, SkipRange

from runmgr.policy.decision import IGNORE, LOWER_LR, RESET_OPTIMIZER, RESTART, Decision
from runmgr.policy.plan_update import merge_ranges, next_plan


def test_skips_accumulate_lr_multiplies_clip_stays_and_reset_is_one_off():
    plan = ResumePlan(subrun="12.03", skip_ranges=(SkipRange(0, 100),), lr_scale=0.5)
    cut = Decision(LOWER_LR, "", restart_from_step=400, skip_ranges=(SkipRange(90, 300),), lr_factor=0.67,
                   clip_grad=0.3)
    after_cut = next_plan(plan, cut, "12.04", "/runs/12/ckpt/400")
    assert after_cut.subrun == "12.04" and after_cut.start_checkpoint == "/runs/12/ckpt/400"
    assert after_cut.skip_ranges == (SkipRange(0, 300),)
    assert after_cut.lr_scale == pytest.approx(0.335) and after_cut.clip_grad == 0.3
    reset = next_plan(after_cut, Decision(RESET_OPTIMIZER, "", reset_optimizer=True, rewarmup_iters=200), "12.05",
                      "/ckpt/400")
    assert reset.reset_optimizer and reset.rewarmup_iters == 200 and reset.clip_grad == 0.3
    restart = next_plan(reset, Decision(RESTART, ""), "12.06", "/ckpt/600")
    assert not restart.reset_optimizer and restart.rewarmup_iters == 0 and restart.lr_scale == reset.lr_scale
    assert ResumePlan.from_json(restart.to_json()) == restart


def test_a_decision_that_does_not_restart_makes_no_plan():
    with pytest.raises(ValueError, match="does not start a sub-run"):
        next_plan(ResumePlan(), Decision(IGNORE, ""), "12.01", None)


def test_merge_ranges_sorts_and_joins():
    ranges = (SkipRange(500, 600), SkipRange(0, 10), SkipRange(10, 20), SkipRange(550, 700))
    assert merge_ranges(ranges) == (SkipRange(0, 20), SkipRange(500, 700))


def test_the_local_norms_steps_a_rollback_asks_for_reach_the_plan_and_stay_with_the_lineage():
    from runmgr.choices import Action

    rollback = Decision(Action.rollback_skip, "spike", restart_from_step=40, local_norms_steps=(41, 42))
    plan = next_plan(ResumePlan(subrun="1.02"), rollback, "1.03", "/ck/step_00000040")
    assert plan.local_norms_steps == (41, 42)
    died = Decision(Action.restart, "a rank died", restart_from_step=40)
    assert next_plan(plan, died, "1.04", "/ck/step_00000040").local_norms_steps == (41, 42)
