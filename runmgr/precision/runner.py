"""The trainer's own step, run in this process on one rank for the check.

No Ray and no process group: one rank needs no collective (the trainer's
gradient averaging is a no-op at world size 1). The runner calls the loop's
parts in the loop's order (reseed, this step's batch, forward/backward,
optimizer step), so that its step-1 and step-2 losses are the ones
``runmgr launch`` would log for the same config, and reads what the loop does
not report: each weight's step-1 gradient norm (the local norm) and the size
of each weight's step-1 update.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

import torch

from trainer.config import TrainerConfig
from trainer.device import resolve_device
from trainer.distributed import DistEnv
from trainer.local_norms import local_norms
from trainer.model import build_model
from trainer.optim import build_optimizer
from trainer.parallel.engine import plain_engine
from trainer.plan import ResumePlan
from trainer.precision import LossScaler, embedding_dtype
from trainer.rng import reseed_for_step, seed_everything
from trainer.steps import StepContext, forward_backward, micro_batches, optimizer_step


@dataclass(frozen=True)
class StageRun:
    """Two optimizer steps from the initial weights at the config's (constant) LR."""

    loss_step1: float
    """Step 1's loss: the forward pass of the initial weights."""
    grad_norm_step1: float
    """Step 1's global gradient norm, before clipping."""
    local_norms: dict[str, float]
    """Step 1's gradient norm of each weight (the backward pass), by name."""
    updates: dict[str, float]
    """Norm of each weight's change by step 1's optimizer step, by name."""
    loss_step2: float
    """Step 2's loss: the weights after one optimizer step."""
    dtypes: dict[str, str]
    """Each weight's dtype as the passes see it (``float32``, ``bfloat16``), by name."""


@dataclass(frozen=True)
class LongRun:
    """``steps`` steps at LR 0: the weights never move, the batches do."""

    losses: tuple[float, ...]
    grad_norms: tuple[float, ...]


@contextlib.contextmanager
def _torch_settings(deterministic: bool, threads: int) -> Iterator[None]:
    """Deterministic algorithms on or off and the intra-op thread count for one
    run, put back afterwards (both are process-wide in torch)."""
    was_deterministic, was_threads = torch.are_deterministic_algorithms_enabled(), torch.get_num_threads()
    torch.use_deterministic_algorithms(deterministic)
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
        torch.set_num_threads(was_threads)


class _Trainee:
    """The model, optimizer and data of one run, from the config's seed."""

    def __init__(self, config: TrainerConfig) -> None:
        from trainer.data import build_sample_stream

        self.config = config
        self.stream = build_sample_stream(config.data, config.model.seq_length, seed=config.training.seed)
        device = resolve_device(config.device, 0, config.training.deterministic)
        seed_everything(config.training.seed)
        self.model = build_model(config.model, embedding_dtype(config.precision)).to(device.torch_device)
        self.optimizer = build_optimizer(self.model, config.optim)
        self.scaler = LossScaler.from_config(config.precision)
        self.ctx = StepContext(config, ResumePlan(), DistEnv(), device, start_step=0, rewarmup_iters=0)
        self.engine = plain_engine(self.model, self.optimizer, device)
        self.cursor = 0

    def forward_backward(self, step: int) -> float:
        """Step ``step``'s loss; its gradients stay on the weights (scaled by the loss scale)."""
        reseed_for_step(self.config.training.seed, step, 0)
        batches, self.cursor = micro_batches(self.stream, self.cursor, self.ctx)
        loss, _seconds = forward_backward(self.engine, batches, self.scaler.scale, self.ctx)
        return loss

    def local_norms(self) -> dict[str, float]:
        """Each weight's gradient norm, unscaled (what the optimizer is given)."""
        scale = self.scaler.scale
        return {name: norm / scale for name, norm in local_norms(self.model.named_parameters()).items()}

    def optimizer_step(self, lr: float) -> float:
        """The loop's update at ``lr``; the global gradient norm before clipping."""
        grad_norm, _skipped = optimizer_step(self.engine, self.scaler, lr, self.ctx)
        return grad_norm

    def weights(self) -> dict[str, torch.Tensor]:
        return {name: param.detach().clone() for name, param in self.model.named_parameters()}


def run_stages(config: TrainerConfig, threads: int = 1) -> StageRun:
    """Step 1 (loss, local norms, update) and step 2's loss of ``config``."""
    with _torch_settings(config.training.deterministic, threads):
        trainee = _Trainee(config)
        loss1 = trainee.forward_backward(1)
        norms = trainee.local_norms()
        before = trainee.weights()
        dtypes = {name: str(dtype).removeprefix("torch.") for name, dtype in trainee.model.pass_dtypes().items()}
        grad_norm = trainee.optimizer_step(trainee.ctx.lr(1))
        updates = {name: float((weight - before[name]).float().norm()) for name, weight in trainee.weights().items()}
        loss2 = trainee.forward_backward(2)
    return StageRun(loss1, grad_norm, norms, updates, loss2, dtypes)


def run_long(config: TrainerConfig, steps: int, threads: int = 1,
             on_step: Optional[Callable[[], None]] = None) -> LongRun:
    """``steps`` steps of ``config`` from the initial weights at LR 0 (Adam's
    update and the weight decay are both proportional to the LR: nothing moves);
    ``on_step()`` after each (the progress lines)."""
    losses, norms = [], []
    with _torch_settings(config.training.deterministic, threads):
        trainee = _Trainee(config)
        for step in range(1, steps + 1):
            losses.append(trainee.forward_backward(step))
            norms.append(trainee.optimizer_step(0.0))
            if on_step is not None:
                on_step()
    return LongRun(tuple(losses), tuple(norms))
