"""The job's effective arguments, and the run config they describe.

A user's Megatron script is driven by its own arguments: they, not this conf's
trainer sections, say its model, its batch, its layout, its precision, how many
iterations the run has and where it saves. :func:`aligned` puts what they say into
a copy of the config (runmgr/megatron/model.py reads them) so that runmgr's
progress, triggers, skip arithmetic, lint and ``--dry-run`` read the job's truth.
"""

from __future__ import annotations

from dataclasses import replace

from runmgr.config.argv import flag_value
from runmgr.config.schema import RunConfig
from runmgr.megatron.model import read_job

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
    """A copy of ``config`` as the job runs it. A job with its own script or arguments: its
    model, batch, parallel sizes, precision, LR and checkpoint directory as its flags say
    (Megatron-LM's defaults for flags it leaves out; :func:`runmgr.megatron.model.read_job`).
    Arguments derived from this conf: its iterations, batch sizes, sequence length and
    checkpoint directory read back from them. The built-in trainer's config: itself."""
    if not config.drives_megatron:
        return config
    if config.job_describes_itself:
        return read_job(config).config
    args = effective_args(config)
    sections = {"training": config.training, "model": config.model}
    for flag, (section, name) in ALIGNED_FLAGS.items():
        value = flag_value(args, flag)
        if value is not None:
            sections[section] = replace(sections[section], **{name: int(value)})
    save = flag_value(args, "--save")
    checkpoint = replace(config.checkpoint, save=save) if save is not None else config.checkpoint
    return replace(config, training=sections["training"], model=sections["model"], checkpoint=checkpoint)
