"""The model's sizes from its config alone, without torch: what ``runmgr
launch --dry-run`` and the lint plan with (importing torch costs seconds).
:mod:`trainer.model` builds the modules these count."""

from __future__ import annotations

from trainer.config import ModelConfig


def kv_heads(cfg: ModelConfig) -> int:
    """Key/value heads: the query groups, or one per query head."""
    return cfg.num_query_groups or cfg.num_attention_heads


def head_dim(cfg: ModelConfig) -> int:
    """Width of one attention head."""
    return cfg.hidden_size // cfg.num_attention_heads


def parameter_count(cfg: ModelConfig) -> int:
    """Number of parameters of :class:`trainer.model.Transformer` for ``cfg``, computed from
    the shapes alone (nothing is allocated)."""
    h, f, v = cfg.hidden_size, cfg.ffn_hidden_size, cfg.vocab_size
    kv_width = kv_heads(cfg) * head_dim(cfg)
    opt = cfg.family == "opt"
    qkv_out = h + 2 * kv_width
    attention = h * qkv_out + h * h + (qkv_out + h if opt else 0)
    mlp = (h * f + f + f * h + h) if opt else (h * 2 * f + f * h)
    norm = 2 * h if opt else h
    per_layer = attention + mlp + 2 * norm
    embeddings = v * h + (cfg.max_position_embeddings * h if opt else 0)
    output = v * h if cfg.untie_embeddings_and_output_weights else 0
    return embeddings + cfg.num_layers * per_layer + norm + output
