"""The two model families: shapes, causality, recompute, and the analytic
parameter count that runmgr's --dry-run uses for models it never builds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer.config import ModelConfig
from trainer.model import build_model
from trainer.shapes import parameter_count

TINY = ModelConfig(num_layers=2, hidden_size=32, ffn_hidden_size=80, num_attention_heads=4,
                   seq_length=16, max_position_embeddings=16, vocab_size=64)


def variant(**changes) -> ModelConfig:
    return dataclasses.replace(TINY, **changes)


@pytest.mark.parametrize("family", ["llama", "opt"])
@pytest.mark.parametrize("untied", [False, True])
@pytest.mark.parametrize("groups", [None, 2])
def test_parameter_count_matches_the_built_model(family, untied, groups):
    cfg = variant(family=family, untie_embeddings_and_output_weights=untied, num_query_groups=groups)
    model = build_model(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_parameter_count_of_the_published_large_models():
    opt_175b = ModelConfig(family="opt", num_layers=96, hidden_size=12288, ffn_hidden_size=49152,
                           num_attention_heads=96, seq_length=2048, max_position_embeddings=2048, vocab_size=50272)
    assert 174.5e9 < parameter_count(opt_175b) < 175.5e9
    llama2_70b = ModelConfig(family="llama", num_layers=80, hidden_size=8192, ffn_hidden_size=28672,
                             num_attention_heads=64, num_query_groups=8, seq_length=4096,
                             max_position_embeddings=4096, vocab_size=32000, untie_embeddings_and_output_weights=True)
    assert 68.9e9 < parameter_count(llama2_70b) < 69.1e9  # LLaMA-2 70B: 68.98B


@pytest.mark.parametrize("family", ["llama", "opt"])
def test_logits_shape_and_causality(family):
    torch.manual_seed(0)
    model = build_model(variant(family=family)).eval()
    tokens = torch.randint(0, 64, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 64)
    changed = tokens.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % 64
    # A later token never changes an earlier position's prediction.
    assert torch.equal(model(changed)[:, :10], logits[:, :10])
    assert not torch.equal(model(changed)[:, 10:], logits[:, 10:])


def test_family_specific_parts():
    llama, opt = build_model(variant(family="llama")), build_model(variant(family="opt"))
    assert not any(name.endswith("bias") for name, _ in llama.named_parameters())
    assert any(name.endswith("bias") for name, _ in opt.named_parameters())
    assert llama.positions is None and opt.positions.weight.shape == (16, 32)
    assert 0.015 < float(opt.positions.weight.detach().std()) < 0.025  # Gaussian init with init_method_std
    assert llama.output is None  # tied: the output uses the embedding matrix
    assert build_model(variant(untie_embeddings_and_output_weights=True)).output.weight.shape == (64, 32)


def test_grouped_query_attention_has_fewer_key_value_weights():
    full, grouped = build_model(variant(num_query_groups=None)), build_model(variant(num_query_groups=1))
    assert full.blocks["0"].attn.qkv.weight.shape == (32 * 3, 32)
    assert grouped.blocks["0"].attn.qkv.weight.shape == (32 + 2 * 8, 32)


def test_activation_recompute_gives_the_same_gradients():
    torch.manual_seed(0)
    plain = build_model(variant())
    recomputed = build_model(variant(recompute_granularity="full"))
    recomputed.load_state_dict(plain.state_dict())
    tokens = torch.randint(0, 64, (2, 16))
    for model in (plain, recomputed):
        model(tokens).float().logsumexp(-1).mean().backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), recomputed.named_parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6), name
