"""The smallest trainer config the agents' tests train over real gloo ranks."""

from __future__ import annotations

from pathlib import Path

from trainer.cli import config_from_dict
from trainer.config import TrainerConfig


def tiny_config(save: Path, iters: int, save_interval: int) -> TrainerConfig:
    """One layer of 32, 16 tokens, 4 sequences a step; checkpoints written synchronously."""
    return config_from_dict({
        "device": "cpu",
        "model": {"family": "llama", "num_layers": 1, "hidden_size": 32, "ffn_hidden_size": 96,
                  "num_attention_heads": 4, "num_query_groups": 2, "seq_length": 16, "max_position_embeddings": 16},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "lr_warmup_iters": 1},
        "data": {"corpus_max_bytes": 50_000},
        "training": {"micro_batch_size": 2, "global_batch_size": 4, "train_iters": iters, "seed": 3,
                     "deterministic": True},
        "parallel": {"dist_timeout_s": 60.0},
        "checkpoint": {"save": str(save), "save_interval": save_interval, "keep_last": 3, "async_save": False},
    })
