"""The rules that read the typed config alone: pure functions of a
:class:`~trainer.config.TrainerConfig`, each returning a finding or None."""

from __future__ import annotations

import math
from typing import Callable, Optional

from runmgr.lint.findings import Finding
from runmgr.lint.rules import RULES
from trainer.config import TrainerConfig

BETA2_MAX = 0.99
EPS_MAX = 1e-6
WEIGHT_DECAY_MIN = 0.05
LR_FACTOR = 10.0
"""peak-lr flags a learning rate more than this many times the usual one."""
SCALE_TOKENS = (1 << 20, 4 << 20)
"""Seed 000's scale: about 1e-5 for a global batch of 1M tokens, 1e-4 for 4M."""
SCALE_LR = (1e-5, 1e-4)
SMALL_BATCH_LR_MAX = 1e-2
"""Below 1M tokens per batch the seed gives no scale (its scale is a 70B model's);
there only its example of a too-high LR, 2e-2, counts: at least 1e-2 is flagged."""


def adam_beta2(config: TrainerConfig) -> Optional[Finding]:
    beta2 = config.optim.adam_beta2
    if beta2 < BETA2_MAX:
        return None
    return RULES["adam-beta2"].finding(
        f"optim.adam_beta2 is {beta2} (>= {BETA2_MAX}): Adam's update turns unstable and the loss spikes",
        "set optim.adam_beta2=0.95")


def adam_eps(config: TrainerConfig) -> Optional[Finding]:
    eps = config.optim.adam_eps
    if eps < EPS_MAX:
        return None
    return RULES["adam-eps"].finding(f"optim.adam_eps is {eps:g} (>= {EPS_MAX:g})", "set optim.adam_eps=1e-8")


def dropout(config: TrainerConfig) -> Optional[Finding]:
    model = config.model
    if model.hidden_dropout == 0 and model.attention_dropout == 0:
        return None
    return RULES["dropout"].finding(
        f"dropout is on in pretraining: model.hidden_dropout={model.hidden_dropout}, "
        f"model.attention_dropout={model.attention_dropout}",
        "set model.hidden_dropout=0.0 model.attention_dropout=0.0")


def weight_decay_low(config: TrainerConfig) -> Optional[Finding]:
    decay = config.optim.weight_decay
    if not config.precision.bf16 or decay >= WEIGHT_DECAY_MIN:
        return None
    return RULES["weight-decay-low"].finding(
        f"optim.weight_decay is {decay} (< {WEIGHT_DECAY_MIN}) with precision.bf16=true: it invites loss spikes",
        "set optim.weight_decay=0.1")


def decay_1d(config: TrainerConfig) -> Optional[Finding]:
    if not config.optim.decay_1d_weights:
        return None
    return RULES["decay-1d"].finding(
        "optim.decay_1d_weights is true: weight decay also shrinks biases and norm gains (Megatron decays "
        "matrices only; a precision-tuning guide traced a 0.1 loss gap to it)",
        "set optim.decay_1d_weights=false")


def no_warmup(config: TrainerConfig) -> Optional[Finding]:
    optim = config.optim
    if optim.lr_warmup_fraction is not None:
        if optim.lr_warmup_fraction > 0:
            return None
    elif optim.lr_warmup_iters > 0:
        return None
    return RULES["no-warmup"].finding(
        f"no learning-rate warmup: the LR starts at its peak optim.lr={optim.lr:g} "
        f"(optim.lr_warmup_iters={optim.lr_warmup_iters}, optim.lr_warmup_fraction={optim.lr_warmup_fraction})",
        "set optim.lr_warmup_fraction=0.01 (as the LLaMA2-70B NPU case did) or optim.lr_warmup_iters to a few hundred steps")


def tokens_per_batch(config: TrainerConfig) -> int:
    return config.training.global_batch_size * config.model.seq_length


def usual_lr(tokens: int) -> Optional[float]:
    """Seed 000's usual peak LR for a global batch of ``tokens``: 1e-5 at 1M,
    1e-4 at 4M, log-linear between, 1e-4 above; None below 1M (no scale)."""
    (low_tokens, high_tokens), (low_lr, high_lr) = SCALE_TOKENS, SCALE_LR
    if tokens < low_tokens:
        return None
    if tokens >= high_tokens:
        return high_lr
    share = math.log(tokens / low_tokens) / math.log(high_tokens / low_tokens)
    return low_lr * (high_lr / low_lr) ** share


def peak_lr(config: TrainerConfig) -> Optional[Finding]:
    lr, tokens = config.optim.lr, tokens_per_batch(config)
    usual = usual_lr(tokens)
    batch = f"{tokens:,} tokens per batch (training.global_batch_size x model.seq_length)"
    if usual is None:
        if lr < SMALL_BATCH_LR_MAX:
            return None
        return RULES["peak-lr"].finding(f"optim.lr is {lr:g} (>= {SMALL_BATCH_LR_MAX:g}) at {batch}",
                                        f"lower optim.lr below {SMALL_BATCH_LR_MAX:g} and keep a warmup")
    if lr <= LR_FACTOR * usual:
        return None
    return RULES["peak-lr"].finding(
        f"optim.lr is {lr:g}, {lr / usual:.0f}x the usual {usual:.1e} for {batch}",
        f"set optim.lr near {usual:.1e} (the LLaMA2-70B NPU case: ~1e-4 for 4M tokens, ~1e-5 for 1M) and keep a warmup")


def clip_off(config: TrainerConfig) -> Optional[Finding]:
    if config.optim.clip_grad > 0:
        return None
    return RULES["clip-off"].finding("optim.clip_grad is 0: gradient clipping is off", "set optim.clip_grad=1.0")


def fp16_static_loss_scale(config: TrainerConfig) -> Optional[Finding]:
    """The built-in scaler is dynamic unless it can never go down (min = initial scale)."""
    p = config.precision
    if not p.fp16 or p.min_loss_scale < p.initial_loss_scale:
        return None
    return RULES["fp16-static-loss-scale"].finding(
        f"precision.fp16 with precision.min_loss_scale = precision.initial_loss_scale = {p.initial_loss_scale:g}: "
        "the loss scale can never drop, so an overflow is skipped again at every step",
        f"set precision.min_loss_scale=1.0 (dynamic scaling down from {p.initial_loss_scale:g}) or use bf16")


CONFIG_RULES: tuple[Callable[[TrainerConfig], Optional[Finding]], ...] = (
    adam_beta2, adam_eps, dropout, weight_decay_low, decay_1d, no_warmup, peak_lr, clip_off, fp16_static_loss_scale,
)
"""The config rules, in the rules table's order."""


def check_config(config: TrainerConfig) -> list[Finding]:
    """Every config rule's finding."""
    return [finding for rule in CONFIG_RULES if (finding := rule(config)) is not None]
