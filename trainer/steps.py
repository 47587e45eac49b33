"""One optimizer step, in three parts the loop calls in order: this rank's
micro-batches, forward/backward over them, and the synchronised update
(average gradients, unscale, clip, step)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np
import torch

from trainer.config import TrainerConfig
from trainer.data.windows import inputs_and_labels
from trainer.device import Device
from trainer.distributed import DistEnv
from trainer.errors import TrainerConfigError
from trainer.loss import cross_entropy
from trainer.optim import lr_at, set_lr
from trainer.parallel.engine import Engine
from trainer.parallel.gradients import local_part
from trainer.parallel.layout import Layout
from trainer.plan import ResumePlan
from trainer.precision import LossScaler, autocast, grads_finite, unscale_


@dataclass(frozen=True)
class StepContext:
    """What every step needs to know and never changes during a sub-run."""

    config: TrainerConfig
    plan: ResumePlan
    dist_env: DistEnv
    device: Device
    start_step: int
    """Step the sub-run resumed from; re-warmup counts from here."""
    rewarmup_iters: int
    schedule_origin: int = 0
    """Step at which the LR schedule (re)started: step s gets the schedule's s - origin."""

    @property
    def layout(self) -> Layout:
        return self.config.layout(self.dist_env.world_size)

    @property
    def accumulation(self) -> int:
        return self.config.accumulation_steps(self.dist_env.world_size)

    @property
    def samples_per_rank(self) -> int:
        return self.config.training.global_batch_size // self.config.data_parallel_size(self.dist_env.world_size)

    @property
    def clip_grad(self) -> float:
        """The plan's clip override wins over the config's."""
        return self.plan.clip_grad if self.plan.clip_grad is not None else self.config.optim.clip_grad

    def lr(self, step: int) -> float:
        return lr_at(step - self.schedule_origin, self.config.optim, self.config.training.train_iters,
                     self.plan.lr_scale, self.start_step - self.schedule_origin, self.rewarmup_iters)


def micro_batches(stream, cursor: int, ctx: StepContext) -> tuple[list[torch.Tensor], int]:
    """This rank's micro-batches of the global batch starting at ``cursor``
    (data-parallel replica r takes the r-th contiguous slice, split in order;
    the tensor-parallel ranks and pipeline stages of a replica take the same), and the cursor
    after the global batch. Each tensor is (micro, seq_length + 1) tokens."""
    positions, next_cursor = stream.take(cursor, ctx.config.training.global_batch_size)
    per_rank, micro = ctx.samples_per_rank, ctx.config.training.micro_batch_size
    replica = ctx.layout.coords(ctx.dist_env.rank).dp
    mine = positions[replica * per_rank:(replica + 1) * per_rank]
    tokens = np.stack([stream.tokens(p) for p in mine]).astype(np.int64, copy=False)
    vocab = ctx.config.model.vocab_size
    if tokens.size and (int(tokens.max()) >= vocab or int(tokens.min()) < 0):
        raise TrainerConfigError(
            f"the data holds token {int(tokens.max())} but model.vocab_size is {vocab}; "
            "set model.vocab_size to the tokenizer's vocabulary size"
        )
    batch = torch.from_numpy(tokens).to(ctx.device.torch_device)
    return list(batch.split(micro)), next_cursor


def forward_backward(engine: Engine, batches: list[torch.Tensor], loss_scale: float,
                     ctx: StepContext) -> tuple[Optional[float], float]:
    """Accumulate gradients of the (scaled) mean loss over ``batches``.
    Returns this rank's mean loss (None on a pipeline stage before the last)
    and the seconds of compute."""
    model = engine.model
    model.train()
    model.zero_grad(set_to_none=True)
    started = time.perf_counter()
    if engine.schedule is not None:
        loss = engine.schedule.forward_backward(batches, loss_scale)
        ctx.device.synchronize()
        return loss, time.perf_counter() - started
    total = torch.zeros((), dtype=torch.float32, device=ctx.device.torch_device)
    for index, batch in enumerate(batches):
        inputs, labels = inputs_and_labels(batch)
        with autocast(ctx.device.autocast_type, ctx.config.precision):
            logits = model(inputs)
        with engine.loss_context():  # vocabulary-sharded logits under tensor parallelism
            loss = cross_entropy(logits, labels)
            engine.before_backward(last=index == len(batches) - 1)
            (loss * (loss_scale / len(batches))).backward()
        total += local_part(loss.detach())
    ctx.device.synchronize()
    return float(total) / len(batches), time.perf_counter() - started


def optimizer_step(engine: Engine, scaler: LossScaler, lr: float, ctx: StepContext,
                   before_clip: Optional[Callable[[], None]] = None) -> tuple[float, bool]:
    """Average gradients over data parallel, unscale, clip, and step unless
    they overflowed. Returns the gradient norm before clipping and whether
    the update was skipped. Every rank gets the same norm, so every rank
    takes the same decision without another collective. ``before_clip`` runs
    on the averaged, unscaled gradients before clipping (the loop reads the
    local norms there; a collective on non-plain layouts: every rank calls it)."""
    engine.reduce_gradients()
    unscale_(engine.parameters, scaler.scale)
    if before_clip is not None:
        before_clip()
    grad_norm = engine.clip_gradients(ctx.clip_grad)
    skipped = not grads_finite(grad_norm)
    if not skipped:
        set_lr(engine.optimizer, lr)
        engine.optimizer.step()
    scaler.update(overflow=skipped)
    return grad_norm, skipped
