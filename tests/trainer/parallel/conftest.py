"""Shared runs of the parallel-layout tests: one tiny model and data, trained
on 4 real CPU ranks (gloo on 127.0.0.1) under each layout, compared with the
plain data-parallel run of the same config (computed once per session)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import pytest

PARALLEL_STEPS = 50
"""Steps each layout trains before its losses are compared with data parallel's."""
WORLD = 4


def tiny_config(save_dir: Optional[Path] = None, **sections) -> dict:
    """The shared tiny model: 4 layers (2 per pipeline stage), 4 heads in 2
    key/value groups (whole groups per tensor-parallel rank), untied output
    (a pipeline's last stage holds it), fp32, no dropout: what differs
    between layouts is the order of float sums alone."""
    config = {
        "device": "cpu",
        "model": {"family": "llama", "num_layers": 4, "hidden_size": 64, "ffn_hidden_size": 128,
                  "num_attention_heads": 4, "num_query_groups": 2, "seq_length": 32, "max_position_embeddings": 32,
                  "untie_embeddings_and_output_weights": True},
        "optim": {"lr": 3e-3, "min_lr": 3e-4, "lr_warmup_iters": 5},
        "data": {"corpus_max_bytes": 200_000},
        "training": {"micro_batch_size": 2, "global_batch_size": 16, "train_iters": PARALLEL_STEPS, "seed": 11,
                     "deterministic": True, "local_norms_interval": 0},
        "parallel": {"dist_timeout_s": 60.0},
        "checkpoint": {"save": str(save_dir) if save_dir else None, "save_interval": 25, "keep_last": 0,
                       "async_save": False},
    }
    for section, values in sections.items():
        config[section] = {**config.get(section, {}), **values}
    return config


@pytest.fixture(scope="session")
def launch_layout(tmp_path_factory):
    """``launch_layout(parallel: dict, world_size=4, **sections) -> Ranks``:
    the tiny config at a parallel layout, on real rank processes."""
    from tests.trainer.conftest import Ranks, launch_processes

    launched: list[Ranks] = []

    def launch(parallel: dict, world_size: int = WORLD, plan: Optional[dict] = None, **sections) -> Ranks:
        out = tmp_path_factory.mktemp("layout")
        config = tiny_config(out / "checkpoints", parallel={**{"dist_timeout_s": 60.0}, **parallel}, **sections)
        ranks = launch_processes(out, config, plan, world_size)
        launched.append(ranks)
        return ranks

    yield launch
    for ranks in launched:
        ranks.kill_all()


@pytest.fixture(scope="session")
def data_parallel_run(launch_layout):
    """The reference: plain data parallel on 4 ranks; its results by rank."""
    ranks = launch_layout({})
    return {"ranks": ranks, "results": ranks.wait(timeout=600)}
