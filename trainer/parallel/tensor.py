"""Tensor parallelism (Megatron's split, expressed with DTensor's
``parallelize_module``): each rank of a tensor-parallel group holds a slice of
every large matrix.

- attention: the fused ``qkv`` column-wise (its output is in Megatron's
  grouped layout, so a rank gets whole key/value groups and the forward reads
  the local group count), ``proj`` row-wise (one all-reduce);
- MLP: ``gate`` and ``up`` column-wise, ``down`` row-wise (one all-reduce);
- the embedding vocabulary-parallel (row-wise on ``nn.Embedding``: each rank
  looks up its vocabulary rows, the partial sums are all-reduced);
- the output (or the tied output, which multiplies by the vocabulary-sharded
  embedding weight) column-wise, leaving the logits sharded over the
  vocabulary: the cross entropy runs under :func:`loss_context`
  (``loss_parallel``), so no rank ever holds the whole logits.

With ``parallel.sequence_parallel`` the norms and dropouts run on a slice of
the sequence (``SequenceParallel``), and the all-reduces become an all-gather
before each column-wise layer and a reduce-scatter after each row-wise one
(as in torchtitan). The residual stream between blocks is then this rank's
slice of the sequence.

Every rank builds the whole model from the same seed first; the styles then
keep each rank's slices, so a tensor-parallel run starts from the weights a
plain run starts from.
"""

from __future__ import annotations

import contextlib
from typing import ContextManager

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from trainer.config import TrainerConfig


def apply_tensor_parallel(model: nn.Module, tp_mesh: DeviceMesh, config: TrainerConfig) -> None:
    """Split ``model`` (a :class:`trainer.model.Transformer`, possibly one
    pipeline stage of it) over ``tp_mesh`` in place."""
    sequence = config.parallel.sequence_parallel
    parallelize_module(model, tp_mesh, _top_plan(model, sequence))
    for block in model.blocks.values():
        parallelize_module(block, tp_mesh, _block_plan(block, sequence))


def _stream() -> Shard:
    """The residual stream's placement under sequence parallelism: a slice of
    the sequence (dimension 1 of batch x seq x hidden)."""
    return Shard(1)


def _top_plan(model: nn.Module, sequence: bool) -> dict[str, ParallelStyle]:
    """The embedding, the learned positions, the final norm and the output
    (those this stage holds)."""
    stream = _stream() if sequence else Replicate()
    plan: dict[str, ParallelStyle] = {}
    if model.embedding is not None:
        plan["embedding"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=stream)
        if model.positions is not None and sequence:
            # (seq, hidden): this rank adds the positions of its slice of the sequence.
            plan["positions"] = PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0))
    if model.final_norm is not None:
        if sequence:
            plan["final_norm"] = SequenceParallel()
        # Logits stay sharded over the vocabulary (a DTensor), for the parallel cross entropy.
        if model.output is not None:
            plan["output"] = ColwiseParallel(input_layouts=stream, output_layouts=Shard(-1), use_local_output=False)
        else:
            plan["tied_output"] = PrepareModuleInput(
                input_layouts=(stream, Shard(0)), desired_input_layouts=(Replicate(), Shard(0)), use_local_output=False)
    return plan


def _block_plan(block: nn.Module, sequence: bool) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {
        "attn.qkv": ColwiseParallel(),
        "attn.proj": RowwiseParallel(output_layouts=_stream() if sequence else Replicate()),
        "mlp.up": ColwiseParallel(),
        "mlp.down": RowwiseParallel(output_layouts=_stream() if sequence else Replicate()),
    }
    if block.mlp.gate is not None:
        plan["mlp.gate"] = ColwiseParallel()
    if sequence:
        gather = PrepareModuleInput(input_layouts=(_stream(),), desired_input_layouts=(Replicate(),),
                                    use_local_output=True)
        plan.update({"attn_norm": SequenceParallel(), "attn": gather, "mlp_norm": SequenceParallel(), "mlp": gather})
    return plan


def loss_context(tp: int) -> ContextManager:
    """What the cross entropy and its backward run under: ``loss_parallel``
    when the logits are sharded over the vocabulary (``tp`` > 1)."""
    return loss_parallel() if tp > 1 else contextlib.nullcontext()
