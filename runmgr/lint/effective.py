"""The settings a run really trains with, for the config rules. A Megatron job
with its own arguments trains with those, not with the conf's sections, so
their values for the linted settings replace the conf's (seed 002: every
restart's effective settings must be checked); any other run is its config."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from runmgr.config.argv import flag_value, has_flag
from runmgr.config.schema import RunConfig
from runmgr.megatron.job import effective_args

NUMERIC_FLAGS: dict[str, tuple[str, str, Callable[[str], object]]] = {
    "--adam-beta2": ("optim", "adam_beta2", float),
    "--adam-eps": ("optim", "adam_eps", float),
    "--weight-decay": ("optim", "weight_decay", float),
    "--clip-grad": ("optim", "clip_grad", float),
    "--lr": ("optim", "lr", float),
    "--lr-warmup-iters": ("optim", "lr_warmup_iters", int),
    "--lr-warmup-fraction": ("optim", "lr_warmup_fraction", float),
    "--hidden-dropout": ("model", "hidden_dropout", float),
    "--attention-dropout": ("model", "attention_dropout", float),
}
"""Megatron flag -> (section, field, type) of the linted settings."""
MEGATRON_DEFAULTS = {"--hidden-dropout": 0.1, "--attention-dropout": 0.1, "--clip-grad": 1.0,
                     "--weight-decay": 0.01, "--adam-beta2": 0.999, "--adam-eps": 1e-8, "--lr-warmup-iters": 0}
"""Megatron-LM's defaults (megatron/training/arguments.py) for a flag the job leaves out: its own, not the conf's."""


def effective_config(config: RunConfig) -> RunConfig:
    """``config`` with a Megatron job's own argument values in the linted fields."""
    if not config.job_describes_itself:
        return config
    args = effective_args(config)
    sections = {"optim": config.optim, "model": config.model, "precision": config.precision}
    for flag, (section, name, kind) in NUMERIC_FLAGS.items():
        value = flag_value(args, flag)
        taken = kind(value) if value is not None else MEGATRON_DEFAULTS.get(flag)
        if taken is not None or flag == "--lr-warmup-fraction":
            sections[section] = replace(sections[section], **{name: taken})
    fp16, bf16 = has_flag(args, "--fp16"), has_flag(args, "--bf16")
    static = flag_value(args, "--loss-scale")  # Megatron: a fixed scale; absent = dynamic
    precision = replace(sections["precision"], fp16=fp16, bf16=bf16)
    if fp16 and static is not None:
        precision = replace(precision, initial_loss_scale=float(static), min_loss_scale=float(static))
    elif fp16:
        precision = replace(precision, min_loss_scale=min(precision.min_loss_scale, precision.initial_loss_scale / 2))
    sections["precision"] = precision
    return replace(config, **sections)
