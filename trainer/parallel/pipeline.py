"""Pipeline parallel: each stage keeps a contiguous run of layers, and
``torch.distributed.pipelining`` runs a step's micro-batches through the
stages with the 1F1B schedule over the mesh's ``pp`` group.

Stage 0 holds the embedding and feeds token ids; the last stage holds the
final norm and the (untied) output and computes the trainer's fp32
cross-entropy against the labels. Every rank builds the whole model from the
seed first and drops what is not its stage's, so a pipeline starts from the
same weights as plain data parallel, and the parameter names stay the whole
model's (``blocks`` is a ModuleDict keyed by layer number): a checkpoint
written at one pipeline size loads at another.
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Optional

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

from trainer.config import TrainerConfig
from trainer.data.windows import inputs_and_labels
from trainer.device import Device
from trainer.loss import cross_entropy
from trainer.model import Transformer
from trainer.parallel.gradients import local_part
from trainer.parallel.layout import Layout
from trainer.parallel.tensor import loss_context
from trainer.precision import autocast, compute_dtype


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The layer numbers stage ``stage`` of ``pp`` keeps: an even split by
    number (the config refuses a ``pp`` that does not divide the layers)."""
    per_stage = num_layers // pp
    return range(stage * per_stage, (stage + 1) * per_stage)


def keep_stage(model: Transformer, pp: int, stage: int) -> None:
    """Drop, in place, the layers and the ends of ``model`` that are not stage
    ``stage``'s: the embedding (and learned positions) live on the first stage,
    the final norm and the output on the last."""
    if model.output is None:
        raise ValueError("pipeline parallel needs model.untie_embeddings_and_output_weights=true")
    kept = {str(layer) for layer in stage_layers(len(model.blocks), pp, stage)}
    for name in [name for name in model.blocks if name not in kept]:
        del model.blocks[name]
    if stage != 0:
        model.embedding = None
        model.positions = None
    if stage != pp - 1:
        model.final_norm = None
        model.output = None


class _AutocastForward(nn.Module):
    """The stage's forward under the config's autocast (the schedule calls the
    module itself; backward and the loss stay outside autocast, as in the
    plain step). Holds the stage as ``model``; the engine saves and steps the
    stage itself, so this wrapper never reaches a checkpoint."""

    def __init__(self, model: nn.Module, cast: Callable[[], ContextManager]) -> None:
        super().__init__()
        self.model = model
        self.cast = cast

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.cast():
            return self.model(x)


class PipelineSchedule:
    """One rank's stage in a 1F1B schedule whose micro-batches are the step's
    gradient-accumulation micro-batches."""

    def __init__(self, stage: PipelineStage, n_microbatches: int,
                 loss_context: Callable[[], ContextManager] = contextlib.nullcontext) -> None:
        self.stage = stage
        self.n_microbatches = n_microbatches
        self.loss_context = loss_context
        """What the step runs under: the vocabulary-parallel loss with tensor
        parallel stages (the last stage's logits stay sharded over the vocabulary;
        it changes nothing for plain tensors, so every stage runs under it)."""
        self._scale = 1.0
        self._losses: list[torch.Tensor] = []
        # scale_grads=False: the loss function already divides by the micro-batch count, as the plain step does.
        self.schedule = Schedule1F1B(stage, n_microbatches, loss_fn=self._loss, scale_grads=False)

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        loss = cross_entropy(logits, labels)
        self._losses.append(local_part(loss.detach()))  # unscaled, as the step reports it
        return loss * (self._scale / self.n_microbatches)

    def forward_backward(self, batches: list[torch.Tensor], loss_scale: float) -> Optional[float]:
        """Accumulate the gradients of ``loss * loss_scale / len(batches)`` over
        ``batches`` (windows of seq_length + 1 tokens, the same on every stage of
        a data-parallel replica); the mean unscaled loss on the last stage, None
        on the others."""
        if len(batches) != self.n_microbatches:
            raise ValueError(f"the pipeline schedule runs {self.n_microbatches} micro-batches a step, got {len(batches)}")
        inputs, labels = inputs_and_labels(torch.cat(batches))
        self._scale, self._losses = loss_scale, []
        # The schedule splits the whole batch along dim 0 into the same micro-batches again.
        with self.loss_context():
            if self.stage.is_first:
                self.schedule.step(inputs, return_outputs=False)
            elif self.stage.is_last:
                self.schedule.step(target=labels, losses=[], return_outputs=False)
            else:
                self.schedule.step(return_outputs=False)
        if not self.stage.is_last:
            return None
        return float(torch.stack(self._losses).sum()) / len(self._losses)


def _activation(shape: tuple[int, ...], dtype: torch.dtype, requires_grad: bool) -> torch.Tensor:
    """An example tensor on the meta device: what the stage reads its shape,
    dtype and need for a gradient from (no memory)."""
    return torch.empty(shape, dtype=dtype, device="meta", requires_grad=requires_grad)


def stage_shapes(config: TrainerConfig, stage: int, stages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Example input and output of stage ``stage`` for one micro-batch: token
    ids (micro, seq) into the first stage, the residual stream (micro, seq,
    hidden) between stages (fp32 whatever autocast computes in: the embedding's
    output is fp32 and each block adds onto it), the logits (micro, seq,
    vocab) out of the last stage in the compute dtype.

    With tensor parallel stages the stream crosses a stage boundary as a plain
    tensor between the ranks of the same tensor-parallel coordinate: the whole
    stream (each block's row-wise layers all-reduce it), or with sequence
    parallelism this rank's slice of the sequence (micro, seq / tp, hidden),
    which the next stage's first norm takes as its slice. The last stage's
    logits (a vocabulary-sharded DTensor of the global shape) go to the loss,
    never over the wire.

    Given to the stage up front (torch's static mode), so no stage runs the
    first step's shape-inference forward on uninitialised activations: that
    pass would draw dropout masks from the step's RNG, and a resumed run would
    not repeat the unbroken one. Every step's micro-batches have this shape."""
    micro, seq, model = config.training.micro_batch_size, config.model.seq_length, config.model
    tp = config.parallel.tensor_model_parallel_size
    stream = seq // tp if tp > 1 and config.parallel.sequence_parallel else seq
    hidden = _activation((micro, stream, model.hidden_size), torch.float32, requires_grad=True)
    inputs = torch.empty((micro, seq), dtype=torch.int64, device="meta") if stage == 0 else hidden
    if stage < stages - 1:
        return inputs, hidden
    return inputs, _activation((micro, seq, model.vocab_size), compute_dtype(config.precision), requires_grad=True)


def build_schedule(model: nn.Module, config: TrainerConfig, layout: Layout, rank: int, mesh: DeviceMesh,
                   device: Device) -> PipelineSchedule:
    """The 1F1B schedule of this rank's stage (``model``, already cut by
    :func:`keep_stage`, then split by tensor parallel) over the mesh's ``pp``
    group, with the step's gradient-accumulation micro-batches as its
    micro-batches. The ``pp`` group holds the ranks of this rank's data- and
    tensor-parallel coordinates, so a stage sends its activations to the
    next stage's rank holding the same tensor-parallel slices."""
    stage_index = layout.coords(rank).pp
    wrapped = _AutocastForward(model, lambda: autocast(device.autocast_type, config.precision))
    inputs, outputs = stage_shapes(config, stage_index, layout.pp)
    stage = PipelineStage(wrapped, stage_index, layout.pp, device.torch_device, input_args=inputs,
                          output_args=outputs, group=mesh["pp"].get_group())
    return PipelineSchedule(stage, config.accumulation_steps(layout.world_size), lambda: loss_context(layout.tp))
