"""FSDP2 (``fully_shard``): weights, gradients and optimizer state sharded
over data parallel (ZeRO-3).

Every block is one FSDP unit (its weights are all-gathered just before its
forward and backward, its gradients reduce-scattered right after its
backward), then the root holds the rest (embedding, final norm, output).
Gradients are reduce-scattered with the mean over the data-parallel ranks,
which is the data-parallel average the other layouts all-reduce: the engine
adds nothing. The optimizer is the ordinary AdamW over the sharded
parameters (DTensors), so ``get_state_dict`` and DCP save and reshard both.

No ``MixedPrecisionPolicy``: the parameters are the fp32 master weights and
autocast casts the matmuls to bf16/fp16 as in every other layout, so an FSDP2
run computes what a data-parallel run computes (the price: all-gathers in
fp32, twice the bytes of bf16 ones). The fp16 loss scaler works unchanged: it
scales the loss, and an overflow reaches the global norm through the
reduce-scattered shards.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from trainer.config import TrainerConfig


def apply_fsdp2(model: nn.Module, dp_mesh: DeviceMesh, config: TrainerConfig) -> None:
    """Shard ``model`` in place over ``dp_mesh``: each block, then the root.
    Blocks free their gathered weights after the forward (gathered again for
    the backward: ZeRO-3's memory); the root keeps its own, which the
    backward needs first."""
    del config  # nothing in the config changes how the model is sharded (see the module's doc)
    for block in model.blocks.values():  # type: ignore[union-attr]
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=True)
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=False)


def set_gradient_sync(model: nn.Module, sync: bool) -> None:
    """Whether the next backward reduce-scatters: only the last micro-batch's
    does, the earlier ones accumulate unsharded gradients (one reduce-scatter
    per step, of the sum)."""
    assert isinstance(model, FSDPModule)
    model.set_requires_gradient_sync(sync)
