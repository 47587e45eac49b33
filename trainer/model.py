"""Decoder-only transformer in the two families the project trains.

``llama``: RMSNorm, rotary positions, grouped-query attention, SwiGLU, no
biases. ``opt``: LayerNorm, learned positions, ReLU MLP, biases. Both are
pre-norm with a final norm; the output projection is tied to the embedding
unless ``untie_embeddings_and_output_weights``. Its size from the config
alone is :func:`trainer.shapes.parameter_count` (no torch: ``--dry-run``
plans a 175B model without allocating it, or importing torch).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from trainer.config import ModelConfig
from trainer.shapes import head_dim, kv_heads


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (no bias, no centring)."""

    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in fp32 even under autocast: the mean of squares overflows fp16.
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight).to(x.dtype)


def _norm(cfg: ModelConfig) -> nn.Module:
    if cfg.family == "llama":
        return RMSNorm(cfg.hidden_size, cfg.norm_epsilon)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_epsilon)


class Rotary(nn.Module):
    """Rotary position embedding (rotate-half form) for one head width."""

    def __init__(self, head_dim: int, max_positions: int, base: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        # Not parameters and not saved: they follow from the config.
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Rotate ``x`` of shape (batch, heads, seq, head_dim)."""
        seq = x.shape[-2]
        cos, sin = self.cos[:seq].to(x.dtype), self.sin[:seq].to(x.dtype)
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin


class Attention(nn.Module):
    """Causal self-attention with grouped key/value heads.

    The fused ``qkv`` projection keeps Megatron's layout: its output is grouped
    by key/value head, each group holding its query heads, then its key, then
    its value. A tensor-parallel split of the output dimension then hands each
    rank whole groups, and the forward reads the group count from the tensor
    (it is the local count on a tensor-parallel rank)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        bias = cfg.family == "opt"
        self.heads, self.kv_heads, self.head_dim = cfg.num_attention_heads, kv_heads(cfg), head_dim(cfg)
        kv_width = self.kv_heads * self.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, cfg.hidden_size + 2 * kv_width, bias=bias)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=bias)
        self.dropout = cfg.attention_dropout
        self.rotary = Rotary(self.head_dim, cfg.max_position_embeddings, cfg.rotary_base) if cfg.family == "llama" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _width = x.shape
        per_group = self.heads // self.kv_heads
        grouped = self.qkv(x).view(batch, seq, -1, per_group + 2, self.head_dim)  # -1: the (local) groups
        groups = grouped.shape[2]
        q = grouped[:, :, :, :per_group].reshape(batch, seq, groups * per_group, self.head_dim).transpose(1, 2)
        k = grouped[:, :, :, per_group].transpose(1, 2)
        v = grouped[:, :, :, per_group + 1].transpose(1, 2)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        if per_group != 1:
            k, v = k.repeat_interleave(per_group, dim=1), v.repeat_interleave(per_group, dim=1)
        dropout = self.dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        return self.proj(out.transpose(1, 2).reshape(batch, seq, groups * per_group * self.head_dim))


class MLP(nn.Module):
    """SwiGLU (llama: separate gate and up projections, so that a tensor-parallel
    split of each keeps gate and up rows together) or ReLU (opt)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.gated = cfg.family == "llama"
        bias = not self.gated
        self.gate = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=False) if self.gated else None
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_hidden_size, bias=bias)
        self.down = nn.Linear(cfg.ffn_hidden_size, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.down(F.silu(self.gate(x)) * self.up(x))
        return self.down(F.relu(self.up(x)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm, self.attn = _norm(cfg), Attention(cfg)
        self.mlp_norm, self.mlp = _norm(cfg), MLP(cfg)
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.dropout(self.attn(self.attn_norm(x)))
        return x + self.dropout(self.mlp(self.mlp_norm(x)))


class TiedOutput(nn.Module):
    """The tied output projection: logits = x @ embedding.weight^T. A module
    without parameters of its own (the weight is passed in, so no second
    module aliases the embedding's parameter in a state dict), so that tensor
    parallelism can hook its inputs (the vocabulary-sharded weight makes the
    logits vocabulary-sharded)."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)


class Transformer(nn.Module):
    """Token ids (batch, seq) -> next-token logits (batch, seq, vocab).

    ``blocks`` is a ModuleDict keyed by layer number, so that a pipeline stage
    that keeps some layers (and drops the others, the embedding or the head:
    they become None) keeps every parameter's name, and a checkpoint written at
    one pipeline layout loads at another. A stage without the embedding takes
    the previous stage's hidden states; one without the final norm returns its
    hidden states."""

    def __init__(self, cfg: ModelConfig, embedding_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg = cfg
        self.embedding_dtype = embedding_dtype  # what the passes see the weight in; the parameter stays fp32
        self.embedding: Optional[nn.Embedding] = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.positions = nn.Embedding(cfg.max_position_embeddings, cfg.hidden_size) if cfg.family == "opt" else None
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        self.blocks = nn.ModuleDict({str(layer): Block(cfg) for layer in range(cfg.num_layers)})
        self.final_norm: Optional[nn.Module] = _norm(cfg)
        # Tied: the output reuses embedding.weight through F.linear, so no second
        # module aliases the parameter (checkpoint state dicts stay unambiguous).
        self.output: Optional[nn.Linear] = (
            nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False) if cfg.untie_embeddings_and_output_weights else None
        )
        self.tied_output: Optional[TiedOutput] = None if cfg.untie_embeddings_and_output_weights else TiedOutput()
        self.recompute = cfg.recompute_granularity == "full"
        init_weights(self, cfg)

    def pass_dtypes(self) -> dict[str, torch.dtype]:
        """Each weight's dtype as the forward and backward passes see it (the
        parameters themselves stay in their own dtype): what a precision check
        compares between two configs."""
        seen = {name: param.dtype for name, param in self.named_parameters()}
        if self.embedding is not None:
            seen["embedding.weight"] = self.embedding_dtype
        return seen

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens``: token ids (batch, seq), or hidden states (batch, seq,
        hidden) on a pipeline stage without the embedding."""
        head_weight = None
        if self.embedding is not None:
            x, head_weight = self._embed(tokens)
            if self.positions is not None:
                x = x + self.positions(torch.arange(tokens.shape[1], device=tokens.device))
            x = self.dropout(x)
        else:
            x = tokens
        for block in self.blocks.values():
            if self.recompute and self.training:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        if self.final_norm is None:
            return x
        x = self.final_norm(x)
        if self.output is not None:
            return self.output(x)
        assert head_weight is not None and self.tied_output is not None, \
            "a tied output needs the embedding on the same stage"
        return self.tied_output(x, head_weight)

    def _embed(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The token embeddings, and the weight a tied output multiplies by."""
        assert self.embedding is not None
        master = self.embedding.weight
        if self.embedding_dtype == master.dtype:
            # Through the module, so that tensor parallelism's hooks (a vocabulary split) apply.
            return self.embedding(tokens), master
        # The weight as kept for the passes: its bf16 copy, whose lookup and gradient
        # accumulation then run in bf16 (seed 004's case).
        kept = master.to(self.embedding_dtype)
        return F.embedding(tokens, kept).to(master.dtype), kept.to(master.dtype)


def init_weights(model: Transformer, cfg: ModelConfig) -> None:
    """Gaussian init with ``init_method_std``; the projections that write into
    the residual stream get std / sqrt(2 * layers) (Megatron's scaled init) so
    the residual's variance does not grow with depth. Biases 0, norm gains 1."""
    residual_std = cfg.init_method_std / math.sqrt(2.0 * cfg.num_layers)
    for name, param in model.named_parameters():
        if param.ndim < 2:
            if name.endswith("bias"):
                nn.init.zeros_(param)
            else:
                nn.init.ones_(param)
        elif name.endswith(("attn.proj.weight", "mlp.down.weight")):
            nn.init.normal_(param, mean=0.0, std=residual_std)
        else:
            nn.init.normal_(param, mean=0.0, std=cfg.init_method_std)


def build_model(cfg: ModelConfig, embedding_dtype: torch.dtype = torch.float32) -> Transformer:
    """A freshly initialised model; seed torch's RNG first for a reproducible
    init. ``embedding_dtype``: see :func:`trainer.precision.embedding_dtype`."""
    return Transformer(cfg, embedding_dtype)
