"""What a rank holds in memory for its share of the model: the bytes a
``--dry-run`` plan predicts and a run measures."""

from __future__ import annotations

import torch

from trainer.parallel.gradients import local_part


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in ``optimizer``'s state on this rank (only the
    local shard of a DTensor): AdamW's moments and step counters. 0 before
    the first step creates them."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if isinstance(value, torch.Tensor):
                part = local_part(value)
                total += part.numel() * part.element_size()
    return total
