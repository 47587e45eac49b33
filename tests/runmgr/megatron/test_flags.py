"""Each plan change as the flavor's flags, the user's own flags replaced, never doubled."""

from __future__ import annotations

import pytest

from trainer.plan import ResumePlan, SkipRange

from runmgr.config.argv import flag_names, flag_values
from runmgr.config.megatron import MegatronFlavor
from runmgr.megatron.flags import PlanNotCarried, checkpoint_step, iterations_to_skip, script_args

LM, MINDSPEED = MegatronFlavor.megatron_lm, MegatronFlavor.mindspeed_llm
USER = ["--num-layers", "2", "--save", "/ckpt", "--load", "/ckpt", "--train-iters", "100",
        "--global-batch-size", "16", "--lr", "3e-4", "--min-lr", "3e-5", "--clip-grad", "1.0"]


def args_for(plan, flavor=LM, step=None, user=USER):
    return script_args(user, plan, flavor, step)


def test_a_fresh_plan_keeps_the_users_flags_but_never_their_load():
    args = args_for(ResumePlan(subrun="1.00"))
    assert "--load" not in args  # their --load would resume the newest checkpoint, not initialisation
    assert flag_values(args, "--lr") == ["3e-4"] and flag_values(args, "--clip-grad") == ["1.0"]


@pytest.mark.parametrize("name, step", [("step_00000120", 120), ("iter_0000120", 120), ("latest", None), (None, None)])
def test_the_checkpoint_step_is_read_from_its_directory_name(name, step):
    assert checkpoint_step(f"/ckpt/{name}" if name else None) == step


def test_the_start_checkpoint_is_load_and_ckpt_step_once():
    args = args_for(ResumePlan(subrun="1.01", start_checkpoint="/ckpt/step_00000040"), step=40)
    assert flag_names(args).count("--load") == 1
    assert flag_values(args, "--load") == ["/ckpt"] and flag_values(args, "--ckpt-step") == ["40"]


def test_a_start_checkpoint_without_an_iteration_in_its_name_is_not_carried():
    with pytest.raises(PlanNotCarried, match="tells no iteration"):
        args_for(ResumePlan(start_checkpoint="/ckpt/latest"), step=None)


def test_a_lower_lr_scales_lr_and_min_lr_and_overrides_the_scheduler_check():
    args = args_for(ResumePlan(lr_scale=0.5))
    assert flag_values(args, "--lr") == ["0.00015"] and flag_values(args, "--min-lr") == ["1.5e-05"]
    assert flag_names(args).count("--lr") == 1 and "--override-opt_param-scheduler" in args
    again = script_args(args, ResumePlan(lr_scale=0.5), LM, None)  # the user's own override is not doubled
    assert flag_names(again).count("--override-opt_param-scheduler") == 1


def test_a_lower_lr_without_an_lr_to_scale_is_not_carried():
    with pytest.raises(PlanNotCarried, match="no --lr to scale"):
        args_for(ResumePlan(lr_scale=0.5), user=["--save", "/c", "--global-batch-size", "8"])


def test_a_lower_clip_replaces_the_users():
    args = args_for(ResumePlan(clip_grad=0.3))
    assert flag_values(args, "--clip-grad") == ["0.3"] and flag_names(args).count("--clip-grad") == 1


def test_an_optimizer_reset_is_no_load_optim():
    assert "--no-load-optim" in args_for(ResumePlan(reset_optimizer=True))
    assert "--no-load-optim" not in args_for(ResumePlan())


def test_a_rewarmup_is_refused_for_megatron_has_none():
    with pytest.raises(PlanNotCarried, match="--no-load-optim"):
        args_for(ResumePlan(rewarmup_iters=50))


def test_a_data_parallel_size_other_than_the_world_is_refused():
    with pytest.raises(PlanNotCarried, match="data parallel 2"):
        script_args(USER, ResumePlan(data_parallel_size=2), LM, None, data_parallel_size=4)
    assert script_args(USER, ResumePlan(data_parallel_size=4), LM, None, data_parallel_size=4)


def test_mindspeed_refuses_skips_it_cannot_carry_out():
    with pytest.raises(PlanNotCarried, match="never reads it"):
        args_for(ResumePlan(skip_ranges=(SkipRange(0, 16),)), flavor=MINDSPEED)
    assert "--no-load-optim" in args_for(ResumePlan(reset_optimizer=True), flavor=MINDSPEED)


def test_skipped_samples_are_the_1_indexed_iterations_that_hold_them():
    # iteration J trains on [(J-1)*B, J*B): samples [32, 64) with B=16 are iterations 3 and 4
    assert iterations_to_skip([SkipRange(32, 64)], 16) == [3, 4]
    # a range that starts and ends inside batches takes the whole batches it touches
    assert iterations_to_skip([SkipRange(40, 70)], 16) == [3, 4, 5]


def test_skips_of_a_range_that_starts_mid_lineage_leave_out_what_the_checkpoint_trained_past():
    plan = ResumePlan(start_checkpoint="/ckpt/step_00000010", skip_ranges=(SkipRange(0, 32), SkipRange(160, 208)))
    args = args_for(plan, step=10)
    assert flag_values(args, "--iterations-to-skip") == ["11", "12", "13"]


def test_skips_merge_with_the_users_own_iterations_to_skip():
    user = [*USER, "--iterations-to-skip", "50", "12"]
    args = script_args(user, ResumePlan(skip_ranges=(SkipRange(160, 208),)), LM, None)
    assert flag_names(args).count("--iterations-to-skip") == 1
    assert flag_values(args, "--iterations-to-skip") == ["11", "12", "13", "50"]


def test_a_skip_window_drawn_from_an_absurd_batch_is_never_more_iterations_than_the_run_has():
    # A job's line with an absurd (but whole) global batch and a spike: the policy's window is far
    # wider than the job's own batch. Iterations past --train-iters (100) never run: the flags stop
    # there, however wide the window (the bound is applied before any iteration is listed).
    plan = ResumePlan(start_checkpoint="/ckpt/step_00000090", skip_ranges=(SkipRange(90 * 16, 200 * 16),))
    args = args_for(plan, step=90)
    assert flag_values(args, "--iterations-to-skip") == [str(i) for i in range(91, 101)]
    assert iterations_to_skip([SkipRange(2**64, 2**64 + 16)], 16, until=100) == []
