"""Gradients across a layout: the data-parallel average, the global norm and
clipping, for parameters that may be DTensors (tensor parallel, FSDP2) and
may live on one pipeline stage only.

The average is ONE flat all-reduce of this rank's local gradient shards over
its data-parallel group: its reduction order is fixed by the layout, so a
resumed run reproduces the uninterrupted one bit for bit."""

from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """The part of ``tensor`` this rank holds (a view: in-place ops change it)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def settle_placements(params: Iterable[nn.Parameter]) -> None:
    """Give every DTensor gradient its parameter's placement, so that its
    local part is exactly this rank's share of the whole gradient before the
    average, the norm and the update. Backward may leave others: partial sums
    (a replicated norm weight used on a slice of the sequence under sequence
    parallelism), or a replicated whole (the vocabulary-parallel embedding's
    backward gathers it)."""
    for param in params:
        grad = param.grad
        if isinstance(grad, DTensor) and tuple(grad.placements) != tuple(param.placements):
            param.grad = grad.redistribute(placements=param.placements)


def _grads(params: Iterable[nn.Parameter]) -> list[torch.Tensor]:
    out = []
    for param in params:
        if param.grad is None:
            # A weight this step did not reach still takes part in the average (fixed layout).
            param.grad = torch.zeros_like(param)
        out.append(local_part(param.grad))
    return out


def average_over(params: list[nn.Parameter], group: Optional[dist.ProcessGroup], size: int) -> None:
    """Replace each gradient's local part by its mean over ``group`` (``size`` ranks)."""
    if size == 1:
        return
    grads = _grads(params)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    flat.div_(size)
    offset = 0
    for grad in grads:
        count = grad.numel()
        grad.copy_(flat[offset:offset + count].view_as(grad))
        offset += count


def holders(param: torch.Tensor, ranks_per_stage: int) -> int:
    """How many ranks of one pipeline stage hold the same values as this rank's
    part of ``param``: all of them for a plain tensor, fewer for a DTensor
    sharded over some mesh dimensions."""
    if not isinstance(param, DTensor):
        return ranks_per_stage
    shards = 1
    for dim, placement in enumerate(param.placements):
        # Any split counts: Shard, and FSDP2's _StridedShard over a tensor-parallel Shard of
        # the same dimension (not a Shard subclass, and its is_shard() is False).
        if not (placement.is_replicate() or placement.is_partial()):
            shards *= param.device_mesh.size(dim)
    return ranks_per_stage // shards


def global_norm(params: list[nn.Parameter], ranks_per_stage: int, device: torch.device) -> float:
    """The L2 norm of every gradient of the whole model, the same float on
    every rank: each rank adds the squares of its parts, weighted by one over
    the number of ranks holding the same part, and one all-reduce over the
    world sums them (pipeline stages hold disjoint layers)."""
    total = torch.zeros((), dtype=torch.float64, device=device)
    for param in params:
        if param.grad is not None:
            part = local_part(param.grad).detach().double()
            total += part.pow(2).sum() / holders(param, ranks_per_stage)
    dist.all_reduce(total)
    return math.sqrt(float(total)) if math.isfinite(float(total)) else float("nan")


def scale_(params: list[nn.Parameter], factor: float) -> None:
    """Multiply every local gradient part by ``factor`` in place."""
    for param in params:
        if param.grad is not None:
            local_part(param.grad).mul_(factor)
