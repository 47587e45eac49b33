"""The job's effective arguments, and the run config they describe.

A user's Megatron script is driven by its own arguments: they, not this conf's
trainer sections, say how many iterations the run has, its global batch and
where it saves. :func:`aligned` puts those numbers into a copy of the config so
that runmgr's progress, triggers and skip arithmetic read the job's truth.
"""

from __future__ import annotations

from dataclasses import replace

from runmgr.config.argv import flag_value
from runmgr.config.schema import RunConfig

ALIGNED_FLAGS: dict[str, tuple[str, str]] = {
    "--train-iters": ("training", "train_iters"),
    "--global-batch-size": ("training", "global_batch_size"),
    "--micro-batch-size": ("training", "micro_batch_size"),
    "--seq-length": ("model", "seq_length"),
}
"""Flags whose value becomes the config field (section, name) of the same meaning."""


def effective_args(config: RunConfig) -> list[str]:
    """The arguments the job's script gets before runmgr's per-sub-run flags: the user's,
    or, for the built-in trainer's dialect without any (no script, no args), this conf's
    sections spelled as Megatron flags."""
    job = config.megatron
    if job.args or job.script is not None:
        return list(job.args)
    from trainer.megatron_args import to_megatron_args  # the dialect lives with the trainer that speaks it

    # runmgr reads the per-rank timings of Megatron's straggler report (runmgr/watch/stragglers.py)
    return [*to_megatron_args(config.trainer_config()), "--log-straggler"]


def aligned(config: RunConfig) -> RunConfig:
    """A copy of ``config`` whose iterations, batch sizes, sequence length and checkpoint
    directory are the ones the job's arguments say."""
    args = effective_args(config)
    sections = {"training": config.training, "model": config.model}
    for flag, (section, name) in ALIGNED_FLAGS.items():
        value = flag_value(args, flag)
        if value is not None:
            sections[section] = replace(sections[section], **{name: int(value)})
    save = flag_value(args, "--save")
    checkpoint = replace(config.checkpoint, save=save) if save is not None else config.checkpoint
    return replace(config, training=sections["training"], model=sections["model"], checkpoint=checkpoint)
