"""Megatron-LM's own log lines (training_log's iteration line, the checkpoint lines), written by
tests that follow a log: a smooth falling loss with chosen spikes."""

from __future__ import annotations

import math
from datetime import datetime, timezone

TRAIN_ITERS = 200
GLOBAL_BATCH = 8


def base_loss(iteration: int) -> float:
    return 2.0 + 3.0 * math.exp(-iteration / 60.0) + 0.01 * math.sin(iteration * 1.7)


def iteration_line(iteration: int, loss: float, at: float = 0.0, step_ms: float = 100.0,
                   total: int = TRAIN_ITERS) -> str:
    stamp = datetime.fromtimestamp(at or 1.7e9 + iteration, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")
    return (f" [{stamp}] iteration {iteration:8d}/ {total:8d} | consumed samples: {iteration * GLOBAL_BATCH:12d} | "
            f"elapsed time per iteration (ms): {step_ms:.1f} | learning rate: 3.000000E-04 | "
            f"global batch size: {GLOBAL_BATCH:5d} | lm loss: {loss:.6E} | loss scale: 1.0 | grad norm: 1.234 | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |")


def saved_lines(iteration: int) -> list[str]:
    return [f"saving checkpoint at iteration {iteration:7d} to /ckpt in torch format",
            f"  successfully saved checkpoint from iteration {iteration:7d} to /ckpt [ t 1/1, p 1/1 ]"]


def loss_at(iteration: int, persistent: range, recovering: range) -> float:
    """The base curve, lifted 3x over ``persistent`` and ``recovering``."""
    lifted = iteration in persistent or iteration in recovering
    return base_loss(iteration) * (3.0 if lifted else 1.0)
