"""AdamW with Megatron's weight-decay scope, the LR schedule, clipping, and
the optimizer settings actually in force.

Weight decay applies to matrices only: biases and 1-D gains are excluded
(seed 004). After a checkpoint load, :func:`apply_hyperparameters` writes the
config's betas/eps/weight decay back into the param groups, because loading
an optimizer state restores the *old* ones silently (OPT logbook, run 12.35).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from trainer.config import OptimConfig

DECAY_GROUP = "decay"
NO_DECAY_GROUP = "no_decay"


def param_groups(model: nn.Module, weight_decay: float, decay_1d_weights: bool = False) -> list[dict]:
    """Two groups: >=2-D weights decay, biases and 1-D weights (norm gains) do
    not, unless ``decay_1d_weights`` (then both groups decay)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (decay if param.ndim >= 2 else no_decay).append(param)
    return [
        {"name": DECAY_GROUP, "params": decay, "weight_decay": weight_decay},
        {"name": NO_DECAY_GROUP, "params": no_decay, "weight_decay": weight_decay if decay_1d_weights else 0.0},
    ]


def build_optimizer(model: nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over :func:`param_groups`."""
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay, cfg.decay_1d_weights), **adamw_settings(cfg))


def adamw_settings(cfg: OptimConfig) -> dict:
    """AdamW's keyword arguments from the config. The for-loop implementation
    (no foreach, no fused) keeps the update order fixed, for bit-exact resumes."""
    return dict(
        lr=cfg.lr,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_eps,
        foreach=False,
        fused=False,
    )


def apply_hyperparameters(optimizer: torch.optim.Optimizer, cfg: OptimConfig) -> None:
    """Write the config's betas, eps and weight decay into every param group."""
    for group in optimizer.param_groups:
        group["betas"] = (cfg.adam_beta1, cfg.adam_beta2)
        group["eps"] = cfg.adam_eps
        spared = group.get("name") == NO_DECAY_GROUP and not cfg.decay_1d_weights
        group["weight_decay"] = 0.0 if spared else cfg.weight_decay


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def warmup_iters(cfg: OptimConfig, train_iters: int) -> int:
    """Warmup length: lr_warmup_fraction of the decay iterations when set, else lr_warmup_iters."""
    if cfg.lr_warmup_fraction is not None:
        return int(round(cfg.lr_warmup_fraction * decay_iters(cfg, train_iters)))
    return cfg.lr_warmup_iters


def decay_iters(cfg: OptimConfig, train_iters: int) -> int:
    return cfg.lr_decay_iters if cfg.lr_decay_iters is not None else train_iters


def scheduled_lr(step: int, cfg: OptimConfig, train_iters: int) -> float:
    """The base schedule at ``step`` (1 = the first optimizer step): linear
    warmup reaching ``lr`` at step ``warmup`` (step 1 gets lr / warmup, never
    0), then decay reaching ``min_lr`` at step ``decay_iters``, then flat."""
    warmup, decay_end = warmup_iters(cfg, train_iters), decay_iters(cfg, train_iters)
    if warmup > 0 and step <= warmup:
        return cfg.lr * step / warmup
    if cfg.lr_decay_style == "constant":
        return cfg.lr
    if step >= decay_end:
        return cfg.min_lr
    progress = (step - warmup) / max(1, decay_end - warmup)
    if cfg.lr_decay_style == "linear":
        factor = 1.0 - progress
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * factor


def lr_at(
    step: int,
    cfg: OptimConfig,
    train_iters: int,
    lr_scale: float = 1.0,
    rewarmup_start: int = 0,
    rewarmup_iters: int = 0,
) -> float:
    """Learning rate of ``step``: the schedule, times the plan's ``lr_scale``,
    times a linear ramp from 0 over ``rewarmup_iters`` steps after
    ``rewarmup_start`` (the step a sub-run resumed from)."""
    lr = scheduled_lr(step, cfg, train_iters) * lr_scale
    since = step - rewarmup_start
    if rewarmup_iters > 0 and 0 < since <= rewarmup_iters:
        lr *= since / rewarmup_iters
    return lr


def clip_gradients(params: Iterable[nn.Parameter], max_norm: float) -> float:
    """Clip by global norm when ``max_norm`` > 0; returns the norm before
    clipping (inf/nan when a gradient overflowed: then nothing is changed)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
    value = float(norm)
    if max_norm > 0 and math.isfinite(value) and value > max_norm:
        factor = max_norm / (value + 1e-6)
        for grad in grads:
            grad.mul_(factor)
    return value


@dataclass(frozen=True)
class GroupSettings:
    """What one param group of the optimizer will really use at its next step."""

    name: str
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    num_params: int
    step: int
    """Adam step count (largest over the group's params; 0 when no state)."""
    moment_norm: float
    """L2 norm of the first moments over the group (0 when no state)."""

    def to_dict(self) -> dict:
        return {**asdict(self), "betas": list(self.betas)}


def effective_settings(optimizer: torch.optim.Optimizer) -> list[GroupSettings]:
    """Read the settings from the optimizer object itself (not the config), so
    a logbook entry shows what a resume really put in force."""
    out = []
    for index, group in enumerate(optimizer.param_groups):
        steps, squares = [0], 0.0
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if "step" in state:
                steps.append(int(float(state["step"])))
            if "exp_avg" in state:
                square = state["exp_avg"].float().pow(2).sum()
                if isinstance(square, DTensor):  # sharded moments (ZeRO-1, FSDP2): every rank's part
                    square = square.full_tensor()  # a collective: every rank reads the settings
                squares += float(square)
        out.append(
            GroupSettings(
                name=str(group.get("name", index)),
                lr=float(group["lr"]),
                betas=(float(group["betas"][0]), float(group["betas"][1])),
                eps=float(group["eps"]),
                weight_decay=float(group["weight_decay"]),
                num_params=sum(p.numel() for p in group["params"]),
                step=max(steps),
                moment_norm=math.sqrt(squares),
            )
        )
    return out
