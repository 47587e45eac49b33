"""Model FLOPs per token and model FLOPs utilisation (MFU), from the model's shape.

The count is PaLM's (Chowdhery et al. 2022, appendix B) as torchtitan and
Megatron-LM report it: ``6 N + 12 L h s`` FLOPs per trained token, where

- ``N`` is the parameters that multiply activations: every weight of the
  blocks and the output projection (a tied embedding counts once, as the output
  projection), but not the embedding lookups (input tokens and learned
  positions), which cost no multiply-adds. 6 = 2 (multiply-add) x 3 (forward,
  and a backward of twice the forward);
- ``12 L h s`` is attention's scores and weighted sum (``QK^T`` and ``AV``: 2 x
  2 h s FLOPs per token per layer in the forward, x 3 with the backward), with
  ``L`` layers, ``h`` the hidden size (heads x head size) and ``s`` the sequence
  length, no saving for the causal mask.

Model FLOPs, not hardware FLOPs: activation recompute adds work that MFU does
not count (it is what the model needs, not what the machine did).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from trainer.config import ModelConfig, TrainerConfig

if TYPE_CHECKING:
    from trainer.device import Device


def matmul_parameters(cfg: ModelConfig) -> int:
    """``N`` of the count: parameters minus the embedding lookups (a tied embedding
    stays, as the output projection). Counted on the meta device: no memory."""
    from trainer.model import build_model  # the model module builds on torch.nn

    with torch.device("meta"):
        model = build_model(cfg)
    total = sum(p.numel() for p in model.parameters())
    lookups = 0
    if model.positions is not None:
        lookups += model.positions.weight.numel()
    if cfg.untie_embeddings_and_output_weights and model.embedding is not None:
        lookups += model.embedding.weight.numel()
    return total - lookups


def flops_per_token(cfg: ModelConfig) -> float:
    """Model FLOPs of one trained token (forward and backward): ``6 N + 12 L h s``."""
    return 6.0 * matmul_parameters(cfg) + 12.0 * cfg.num_layers * cfg.hidden_size * cfg.seq_length


def mfu(tokens_per_s: float, per_token: float, peak_per_device: Optional[float], devices: int) -> Optional[float]:
    """The fraction of the devices' dense peak the model FLOPs reach; None when the peak is unknown."""
    if peak_per_device is None or peak_per_device <= 0 or devices <= 0:
        return None
    return tokens_per_s * per_token / (peak_per_device * devices)


def precision_of(config: TrainerConfig) -> str:
    """The precision the matmuls run in: ``bf16``, ``fp16`` or ``fp32``."""
    return "bf16" if config.precision.bf16 else "fp16" if config.precision.fp16 else "fp32"


@dataclass(frozen=True)
class Throughput:
    """What turns a step's tokens/s into MFU for one run."""

    flops_per_token: float
    peak_per_device: Optional[float]
    """Dense peak FLOP/s of one device at the run's precision; None: unknown (no MFU)."""
    devices: int

    @classmethod
    def of(cls, config: TrainerConfig, device: "Device", world_size: int) -> "Throughput":
        return cls(flops_per_token(config.model), device.peak_flops(precision_of(config)), world_size)

    def mfu(self, tokens_per_s: float) -> Optional[float]:
        return mfu(tokens_per_s, self.flops_per_token, self.peak_per_device, self.devices)
