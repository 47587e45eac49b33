"""tied-from-untied: a tied-embedding model (the output layer reuses the
embedding) started from a checkpoint whose model has a separate output layer.
Seed 000: loss does not converge; random initialisation does better. The
config cannot say where the weights come from beyond the checkpoint directory
the run resumes from, so the rule reads that checkpoint's manifest (the
tensor shapes it records), never the tensors."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from runmgr.config.schema import RunConfig
from runmgr.lint.findings import Finding
from runmgr.lint.rules import RULES
from runmgr.refusals import newest_complete_checkpoint
from trainer.config import ModelConfig
from trainer.manifest import read_manifest, recorded_shapes

OUTPUT_WEIGHT = "output.weight"
"""The separate output layer's tensor in a state dict (an untied model's)."""


def tied_from_untied(model: ModelConfig, checkpoint: Path, shapes: Optional[dict]) -> Optional[Finding]:
    """``shapes``: the tensor shapes the checkpoint's manifest records (None: it records none)."""
    if model.untie_embeddings_and_output_weights or not shapes:
        return None
    separate = sorted(name for name in shapes if name == OUTPUT_WEIGHT or name.endswith("." + OUTPUT_WEIGHT))
    if not separate:
        return None
    return RULES["tied-from-untied"].finding(
        f"model.untie_embeddings_and_output_weights is false (tied) but {checkpoint} holds a separate output "
        f"layer ({separate[0]}): its weights were trained untied",
        "set model.untie_embeddings_and_output_weights=true, or start from random initialisation "
        "(another run.dir or checkpoint.save)")


def check_checkpoint(config: RunConfig) -> list[Finding]:
    """The rule on the checkpoint this run would start from (the newest complete one in its directory)."""
    if config.drives_megatron:
        return []  # a Megatron job's checkpoints have no manifest; its own --load says what it reads
    newest = newest_complete_checkpoint(config.checkpoint_dir())
    if newest is None:
        return []
    finding = tied_from_untied(config.model, newest, recorded_shapes(read_manifest(newest)))
    return [finding] if finding is not None else []
