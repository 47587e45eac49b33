"""Regenerate megatron_spikes_and_hang.log (seeded, deterministic):

    python tests/data/live/make_live_log.py

A Megatron-LM (core) bf16 job's log as rank 0 prints it: log interval 1, 5 s iterations stamped
`[YYYY-MM-DD HH:MM:SS]`, a checkpoint every 50 iterations. Its loss falls with noise; a spike at
iteration 150 lasts 5 iterations and recovers by itself; one from iteration 300 does not; after
iteration 360 the job prints nothing more (a hang). The story the README's "Try it beside a
running job" and tests/runmgr/shadow/test_held_out.py tell with it; not part of the scored corpus.
"""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta, timezone
from pathlib import Path

HERE = Path(__file__).parent
LOG = HERE / "megatron_spikes_and_hang.log"
TOTAL, GBS, SEQ = 1000, 256, 4096
RECOVERING = range(150, 155)
PERSISTENT_FROM = 300
HUNG_AFTER = 360
SAVE_EVERY = 50
START = datetime(2026, 11, 30, 9, 0, 0, tzinfo=timezone.utc)


def loss(rng: random.Random, iteration: int) -> float:
    value = (2.1 + 6.0 * (iteration + 30) ** -0.45) * math.exp(rng.gauss(0.0, 0.01))
    if iteration in RECOVERING or iteration >= PERSISTENT_FROM:
        value *= 1.8
    return value


def iteration_line(stamp: datetime, iteration: int, elapsed_ms: float, value: float, grad: float) -> str:
    return (f" [{stamp:%Y-%m-%d %H:%M:%S}] iteration {iteration:8d}/{TOTAL:8d} | consumed samples: "
            f"{iteration * GBS:12d} | elapsed time per iteration (ms): {elapsed_ms:.1f} | throughput per GPU "
            f"(TFLOP/s/GPU): 412.3 | learning rate: {3e-4 * min(1.0, iteration / 100):.6E} | global batch size: "
            f"{GBS:5d} | lm loss: {value:.6E} | loss scale: 1.0 | grad norm: {grad:.3f} | "
            f"number of skipped iterations:   0 | number of nan iterations:   0 |")


def lines() -> list[str]:
    rng = random.Random(20261130)
    out = ["using world size: 64, data-parallel size: 8, context-parallel size: 1, tensor-model-parallel size: 8",
           f"[after model, optimizer, and learning rate scheduler are built] datetime: {START:%Y-%m-%d %H:%M:%S} ",
           "training ..."]
    clock = START
    for iteration in range(1, HUNG_AFTER + 1):
        elapsed_ms = 5000.0 * math.exp(rng.gauss(0.0, 0.01))
        clock += timedelta(milliseconds=elapsed_ms)
        grad = (0.3 + 2.0 * math.exp(-iteration / 80)) * math.exp(rng.gauss(0.0, 0.1))
        out.append(iteration_line(clock, iteration, elapsed_ms, loss(rng, iteration), grad))
        if iteration % SAVE_EVERY == 0:
            out += [f"saving checkpoint at iteration {iteration:7d} to /shared/ckpt/llama-70b in torch_dist format",
                    f"  successfully saved checkpoint from iteration {iteration:7d} to /shared/ckpt/llama-70b "
                    f"[ t 1/8, p 1/1 ]"]
    return out


if __name__ == "__main__":
    LOG.write_text("\n".join(lines()) + "\n")
    print(f"wrote {LOG}")
