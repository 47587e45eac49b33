"""Megatron's flags <-> the trainer's config: the round trip, Megatron's
defaults, and one-line refusals of what the built-in cannot honour."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from tests import cli
from trainer import exitcodes
from trainer.cli import compose, default_conf_dir, trainer_config
from trainer.errors import TrainerConfigError
from trainer.megatron_args import LLAMA_FLAGS, from_megatron_args, to_megatron_args

REPO = Path(__file__).resolve().parents[2]
SHAPE = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "2", "--train-iters", "10", "--lr", "1e-3", *LLAMA_FLAGS]


def demo_config():
    return trainer_config(compose("demo", [], default_conf_dir()))


def test_the_demo_sections_round_trip_through_megatron_flags():
    config = demo_config()
    args = to_megatron_args(config)
    back = from_megatron_args(args).config
    # keep_last has no flag: the dialect keeps every checkpoint, as Megatron does.
    assert back.checkpoint.keep_last == 0
    # Nor has local_norms_interval: Megatron prints no per-weight norms, so the dialect records none.
    assert back.training.local_norms_interval == 0
    assert dataclasses.replace(back, checkpoint=dataclasses.replace(back.checkpoint, keep_last=3),
                               training=dataclasses.replace(back.training, local_norms_interval=1)) == config
    assert to_megatron_args(back) == args
    assert ["--num-query-groups", "2"] == args[args.index("--num-query-groups"):][:2]
    assert "--group-query-attention" in args and ["--distributed-backend", "gloo"] == args[-2:]


def test_absent_flags_take_megatrons_defaults():
    invocation = from_megatron_args(SHAPE, world_size=2)
    config = invocation.config
    assert config.training.global_batch_size == 2 * 2  # micro x data parallel
    assert (config.optim.adam_beta2, config.optim.weight_decay, config.optim.min_lr) == (0.999, 0.01, 0.0)
    assert config.optim.lr_decay_style == "linear" and config.training.log_interval == 100
    assert config.model.ffn_hidden_size == 128  # Megatron's swiglu default: int(4h * 2/3 / 64) * 64
    assert config.model.max_position_embeddings == 32 and config.device == "auto"
    assert config.checkpoint.save_interval == 10 and not config.checkpoint.async_save
    assert (invocation.load, invocation.ckpt_step, invocation.iterations_to_skip) == (None, None, ())


def test_the_resume_flags_are_read():
    invocation = from_megatron_args([*SHAPE, "--load", "/ck", "--ckpt-step", "5", "--no-load-optim",
                                     "--override-opt-param-scheduler", "--iterations-to-skip", "7", "8",
                                     "--log-straggler", "--no-load-rng"])
    assert (invocation.load, invocation.ckpt_step, invocation.iterations_to_skip) == ("/ck", 5, (7, 8))
    assert invocation.no_load_optim and invocation.override_scheduler and invocation.log_straggler
    assert invocation.no_load_rng and invocation.tracker_file is None
    assert from_megatron_args([*SHAPE, "--override-opt_param-scheduler"]).override_scheduler


@pytest.mark.parametrize("extra, says", [
    (["--foo", "1"], "unknown Megatron flag --foo"),
    (["--use-distributed-optimizer"], "unknown Megatron flag --use-distributed-optimizer"),
    (["--tensor-model-parallel-size", "2"], "--tensor-model-parallel-size: invalid choice: 2"),
    (["--num-query-groups", "2"], "--num-query-groups takes effect only with --group-query-attention"),
    (["--data-path", "1.0", "a", "1.0", "b"], "--data-path takes one dataset prefix"),
    (["--lr-decay-style", "WSD"], "--lr-decay-style: invalid choice: 'WSD'"),
    (["--num-layers", "two"], "--num-layers: invalid int value: 'two'"),
    (["--lr-warmup-iters", "2", "--lr-warmup-fraction", "0.1"], "pass one"),
])
def test_what_the_built_in_cannot_honour_is_refused_with_one_line(extra, says):
    with pytest.raises(TrainerConfigError) as caught:
        from_megatron_args([*SHAPE, *extra])
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_another_architecture_or_a_missing_required_flag_is_refused():
    with pytest.raises(TrainerConfigError, match="builds the LLaMA family only"):
        from_megatron_args([item for item in SHAPE if item != "--swiglu"])
    with pytest.raises(TrainerConfigError, match="--lr is required"):
        from_megatron_args(SHAPE[:-len(LLAMA_FLAGS) - 2] + list(LLAMA_FLAGS))
    opt = demo_config()
    opt.model.family = "opt"
    with pytest.raises(TrainerConfigError, match="no Megatron flags"):
        to_megatron_args(opt)


def test_an_unknown_flag_exits_2_with_one_line_and_no_traceback(tmp_path):
    # A process of its own, forked from the session's CLI fork server (torch imported once: tests/cli.py).
    done = cli.runmgr(*SHAPE, "--foo", "3", module="trainer", cwd=tmp_path, timeout=120,
                      env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert done.returncode == exitcodes.BAD_INPUT
    assert done.stderr.startswith("error: unknown Megatron flag --foo: ") and done.stderr.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing written
