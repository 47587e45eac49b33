"""A Megatron-like trainer: decoder-only transformer, AdamW with a cosine
schedule, bf16/fp16, data parallel over torch.distributed, sharded
checkpoints with manifests. Runs alone (``python -m trainer conf=demo``,
``torchrun -m trainer``) and under runmgr (``trainer.train(...)`` per rank).
Imports nothing from runmgr, health, logbook or ray.

The exports below load lazily, so that ``import trainer.config`` or
``trainer.plan`` (what runmgr's driver needs) does not import torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "train": "trainer.loop",
    "TrainResult": "trainer.loop",
    "NullReporter": "trainer.loop",
    "DistEnv": "trainer.distributed",
    "TrainerConfig": "trainer.config",
    "ResumePlan": "trainer.plan",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
