"""What a rank holds in memory, measured: the bytes of its local parameters,
gradients and optimizer state (a DTensor counts its local shard), and the
process's peak against its baseline. ``runmgr launch --dry-run`` estimates the
same parts (runmgr/dryrun.py); the tests compare the two (docs/throughput.md)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Optional

import torch
from torch import nn

from trainer.parallel.footprint import optimizer_state_bytes


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's shard on this rank; any other tensor as it is."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def tensor_bytes(tensors: Iterable[Optional[torch.Tensor]]) -> int:
    """Bytes of the local parts of ``tensors``, each storage once (a tied weight is one)."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for tensor in tensors:
        if tensor is None:
            continue
        local = _local(tensor)
        key = (local.untyped_storage().data_ptr(), local.storage_offset())
        if key in seen:
            continue
        seen.add(key)
        total += local.numel() * local.element_size()
    return total


@dataclass(frozen=True)
class HeldMemory:
    """Bytes one rank holds, measured at the end of its training."""

    parameters: int
    """Local parameters (its shard under tensor/pipeline parallel or FSDP2)."""
    gradients: int
    """Local gradients present."""
    optimizer: int
    """Local optimizer state."""
    peak: int
    """The device's peak (allocator) or, on CPU, the process's peak RSS."""
    baseline: int
    """Memory in use when training began (after imports, before the model): on CPU the
    process's resident set then, the torch runtime's share of ``peak``."""

    @property
    def states(self) -> int:
        """Parameters + gradients + optimizer state."""
        return self.parameters + self.gradients + self.optimizer

    def to_dict(self) -> dict:
        return asdict(self)


def held_memory(model: nn.Module, optimizer: Optional[torch.optim.Optimizer], peak: int, baseline: int) -> HeldMemory:
    """What ``model`` and ``optimizer`` hold on this rank now."""
    params = list(model.parameters())
    return HeldMemory(tensor_bytes(params), tensor_bytes(p.grad for p in params),
                      optimizer_state_bytes(optimizer) if optimizer is not None else 0, peak, baseline)
