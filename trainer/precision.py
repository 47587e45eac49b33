"""Mixed precision: autocast for the forward pass, fp32 master weights, and
the dynamic loss scaler of fp16 training.

The parameters stay fp32 (they are the master weights); autocast runs the
matmuls in bf16/fp16. With fp16 the loss is multiplied by a scale before
backward so small gradients do not underflow; a step whose gradients
overflowed is skipped and the scale shrinks (Megatron's DynamicGradScaler
semantics: ``hysteresis`` overflows before halving, doubling after
``loss_scale_window`` clean steps, never below ``min_loss_scale``).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import ContextManager

import torch

from trainer.config import PrecisionConfig


def compute_dtype(cfg: PrecisionConfig) -> torch.dtype:
    if cfg.bf16:
        return torch.bfloat16
    return torch.float16 if cfg.fp16 else torch.float32


def embedding_dtype(cfg: PrecisionConfig) -> torch.dtype:
    """The dtype the embedding's weight is kept in for the forward and
    backward passes: bf16 with ``embedding_bf16``, else fp32 (the master
    weights' own dtype, whatever the compute dtype: autocast leaves the
    lookup in fp32)."""
    return torch.bfloat16 if cfg.embedding_bf16 else torch.float32


def autocast(device_type: str, cfg: PrecisionConfig) -> ContextManager:
    """Autocast to bf16/fp16 on ``device_type``; a no-op context for fp32."""
    dtype = compute_dtype(cfg)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device_type, dtype=dtype)


@dataclass
class LossScaler:
    """Dynamic loss scale. With ``dynamic=False`` the scale stays 1.0 and no
    step is ever skipped (bf16 and fp32 need no scaling)."""

    scale: float = 1.0
    """Current multiplier of the loss."""
    dynamic: bool = False
    """True for fp16: scale adapts to overflows."""
    window: int = 1000
    """Clean steps before the scale doubles."""
    hysteresis: int = 2
    """Overflows tolerated (since the last growth) before the scale halves."""
    min_scale: float = 1.0
    """Floor of the scale."""
    clean_steps: int = 0
    """Clean steps since the last overflow or growth."""
    overflows_left: int = 2
    """Overflows still tolerated before the next halving."""

    @classmethod
    def from_config(cls, cfg: PrecisionConfig) -> "LossScaler":
        if not cfg.fp16:
            return cls()
        return cls(
            scale=cfg.initial_loss_scale,
            dynamic=True,
            window=cfg.loss_scale_window,
            hysteresis=cfg.hysteresis,
            min_scale=cfg.min_loss_scale,
            overflows_left=cfg.hysteresis,
        )

    def update(self, overflow: bool) -> None:
        """Advance after a step; ``overflow`` means that step was skipped."""
        if not self.dynamic:
            return
        if overflow:
            self.clean_steps = 0
            self.overflows_left -= 1
            if self.overflows_left <= 0:
                self.scale = max(self.scale / 2.0, self.min_scale)
            return
        self.clean_steps += 1
        if self.clean_steps >= self.window:
            self.clean_steps = 0
            self.overflows_left = self.hysteresis
            self.scale *= 2.0

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Tensors, so the state travels in the sharded checkpoint and loads in place."""
        return {
            "scale": torch.tensor(self.scale, dtype=torch.float64),
            "clean_steps": torch.tensor(self.clean_steps, dtype=torch.int64),
            "overflows_left": torch.tensor(self.overflows_left, dtype=torch.int64),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore the running state; window, hysteresis and floor stay the
        config's (a resume may change them on purpose)."""
        self.scale = float(state["scale"])
        self.clean_steps = int(state["clean_steps"])
        self.overflows_left = int(state["overflows_left"])
        if self.dynamic:
            self.scale = max(self.scale, self.min_scale)


def grads_finite(grad_norm: float) -> bool:
    """An fp16 overflow shows as an inf/nan global gradient norm."""
    return math.isfinite(grad_norm)


def unscale_(params: list[torch.nn.Parameter], scale: float) -> None:
    """Divide gradients by the loss scale in place (no-op at scale 1)."""
    if scale == 1.0:
        return
    inverse = 1.0 / scale
    for param in params:
        if param.grad is not None:
            param.grad.mul_(inverse)
