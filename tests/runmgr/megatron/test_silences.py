"""A Megatron sub-run's planned silences, read from the arguments it really got."""

from __future__ import annotations

from runmgr.megatron.silences import MEGATRON_EVAL_INTERVAL, MEGATRON_EVAL_ITERS, planned_silences

TORCHRUN = ["python", "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", "0", "pretrain_gpt.py"]


def test_the_skips_after_the_start_checkpoint_the_saves_and_the_last_iteration():
    args = [*TORCHRUN, "--train-iters", "500", "--save-interval", "50", "--eval-interval", "100",
            "--eval-iters", "10", "--load", "/ck", "--ckpt-step", "40", "--iterations-to-skip", "12", "41", "42", "43"]
    plan = planned_silences(args, "1.02", 7.0)
    assert plan.subrun == "1.02" and plan.time == 7.0
    assert plan.skipped == (41, 42, 43)  # 12 is behind the start checkpoint
    assert plan.skipped_after(40) == 3 and plan.skipped_after(41) == 2 and plan.skipped_after(43) == 0
    assert plan.save_interval == 50 and plan.final_step == 500
    assert plan.evaluates_after(100) and not plan.evaluates_after(50)
    assert plan.saves_after(50) and plan.saves_after(500) and not plan.saves_after(51)


def test_megatron_s_own_evaluation_defaults_when_the_job_gives_none():
    plan = planned_silences([*TORCHRUN, "--train-iters", "5000"], "1.00", 0.0)
    assert (plan.eval_interval, plan.eval_iters) == (MEGATRON_EVAL_INTERVAL, MEGATRON_EVAL_ITERS) == (1000, 100)
    assert not planned_silences([*TORCHRUN, "--eval-iters", "0"], "1.00", 0.0).evaluates_after(1000)
