"""A Megatron job with its own arguments is linted on those arguments, not on
the conf's sections: seed 000's customer job with beta2 0.999 is named even
though the conf it inherits says 0.95."""

from __future__ import annotations

from dataclasses import replace

import pytest

from runmgr.config.compose import load_run_config
from runmgr.config.megatron import TrainerKind, TrainerSection
from runmgr.lint.config_rules import check_config
from runmgr.lint.effective import effective_config

BASE = ["--bf16", "--adam-beta2", "0.95", "--weight-decay", "0.1", "--hidden-dropout", "0.0",
        "--attention-dropout", "0.0", "--lr", "1.5e-4", "--lr-warmup-fraction", "0.01"]


@pytest.fixture(scope="module")
def llama():
    return load_run_config("llama2_70b", [])


def job(config, args: list[str]):
    """The conf's sections around a Megatron job whose own arguments are ``args``."""
    return replace(config, trainer=TrainerSection(kind=TrainerKind.megatron),
                   megatron=replace(config.megatron, script="pretrain_gpt.py", args=list(args)))


def test_the_jobs_own_arguments_are_linted(llama):
    config = job(llama, [*BASE, "--adam-beta2", "0.999", "--weight-decay", "0.01"])
    assert config.optim.adam_beta2 == 0.95  # the conf's section says otherwise
    assert [f.rule for f in check_config(effective_config(config))] == ["adam-beta2", "weight-decay-low"]
    assert check_config(effective_config(job(llama, BASE))) == []


def test_an_absent_flag_is_megatrons_default_and_a_fixed_fp16_scale_is_static(llama):
    config = job(llama, ["--fp16", "--loss-scale", "1024", "--lr", "1.5e-4", "--lr-warmup-iters", "100"])
    rules = [f.rule for f in check_config(effective_config(config))]
    # Megatron's defaults: beta2 0.999, dropout 0.1; its --loss-scale fixes the fp16 scale.
    assert rules == ["adam-beta2", "dropout", "fp16-static-loss-scale"]
    dynamic = job(llama, ["--fp16", "--lr", "1.5e-4", "--lr-warmup-iters", "100", "--adam-beta2", "0.95",
                          "--hidden-dropout", "0", "--attention-dropout", "0"])
    assert check_config(effective_config(dynamic)) == []
