"""AdamW's weight-decay scope, the LR schedule, clipping, and the settings
actually in force after a state load."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from trainer.config import ModelConfig, OptimConfig
from trainer.model import build_model
from trainer.optim import (
    apply_hyperparameters,
    build_optimizer,
    clip_gradients,
    effective_settings,
    lr_at,
    warmup_iters,
)

OPT = OptimConfig(lr=1.0e-3, min_lr=1.0e-4, lr_decay_style="cosine", lr_warmup_iters=10)


def test_warmup_is_linear_to_the_peak():
    assert [lr_at(s, OPT, 100) for s in (1, 5, 10)] == pytest.approx([1e-4, 5e-4, 1e-3])


def test_cosine_decays_to_min_lr_and_stays_there():
    halfway = 10 + 45
    assert lr_at(halfway, OPT, 100) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert lr_at(100, OPT, 100) == pytest.approx(1e-4)
    assert lr_at(150, OPT, 100) == pytest.approx(1e-4)
    curve = [lr_at(s, OPT, 100) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(curve, curve[1:]))


def test_linear_and_constant_decay():
    linear = dataclasses.replace(OPT, lr_decay_style="linear")
    assert lr_at(55, linear, 100) == pytest.approx(5.5e-4)
    constant = dataclasses.replace(OPT, lr_decay_style="constant")
    assert lr_at(90, constant, 100) == pytest.approx(1e-3)


def test_warmup_fraction_overrides_warmup_iters_and_decay_iters_override_train_iters():
    cfg = dataclasses.replace(OPT, lr_warmup_fraction=0.2, lr_decay_iters=50)
    assert warmup_iters(cfg, 100) == 10
    assert lr_at(50, cfg, 100) == pytest.approx(1e-4)


def test_plan_scales_the_lr_and_rewarms_from_the_resume_step():
    assert lr_at(40, OPT, 100, lr_scale=0.5) == pytest.approx(0.5 * lr_at(40, OPT, 100))
    ramp = [lr_at(s, OPT, 100, rewarmup_start=40, rewarmup_iters=4) for s in (41, 42, 44, 45)]
    base = [lr_at(s, OPT, 100) for s in (41, 42, 44, 45)]
    assert ramp == pytest.approx([base[0] / 4, base[1] / 2, base[2], base[3]])


def model_and_optimizer(**optim):
    model = build_model(ModelConfig(family="opt", num_layers=1, hidden_size=16, ffn_hidden_size=32,
                                    num_attention_heads=2, seq_length=8, max_position_embeddings=8, vocab_size=32))
    return model, build_optimizer(model, dataclasses.replace(OPT, **optim))


def test_weight_decay_only_on_matrices():
    model, optimizer = model_and_optimizer(weight_decay=0.1)
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"])
    names = {id(p): n for n, p in model.named_parameters()}
    exempt = {names[id(p)] for p in no_decay["params"]}
    assert "blocks.0.attn.qkv.bias" in exempt and "final_norm.weight" in exempt and "final_norm.bias" in exempt
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_decay_1d_weights_decays_biases_and_gains_too_and_survives_a_state_load():
    model, optimizer = model_and_optimizer(weight_decay=0.1, decay_1d_weights=True)
    assert [group["weight_decay"] for group in optimizer.param_groups] == [0.1, 0.1]
    take_a_step(model, optimizer)
    fresh = build_optimizer(model, OPT)
    fresh.load_state_dict(optimizer.state_dict())
    apply_hyperparameters(fresh, dataclasses.replace(OPT, weight_decay=0.1))
    assert [group["weight_decay"] for group in fresh.param_groups] == [0.1, 0.0]


def take_a_step(model, optimizer):
    tokens = torch.randint(0, 32, (2, 8))
    model(tokens).logsumexp(-1).mean().backward()
    optimizer.step()


def test_loading_old_optimizer_state_then_reapplying_the_config_betas():
    model, old = model_and_optimizer(adam_beta2=0.999, adam_eps=1e-5)
    take_a_step(model, old)
    new_cfg = dataclasses.replace(OPT, adam_beta2=0.95, adam_eps=1e-8)
    optimizer = build_optimizer(model, new_cfg)
    optimizer.load_state_dict(old.state_dict())
    assert effective_settings(optimizer)[0].betas == (0.9, 0.999)  # the trap: old betas came back
    apply_hyperparameters(optimizer, new_cfg)
    settings = effective_settings(optimizer)
    assert all(s.betas == (0.9, 0.95) and s.eps == 1e-8 for s in settings)
    assert settings[0].step == 1 and settings[0].moment_norm > 0
    assert [s.weight_decay for s in settings] == [0.1, 0.0]


def test_fresh_optimizer_reports_no_steps_and_zero_moments():
    _, optimizer = model_and_optimizer()
    assert all(s.step == 0 and s.moment_norm == 0.0 for s in effective_settings(optimizer))


def test_clipping_scales_to_the_threshold_and_returns_the_norm_before():
    params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(1))]
    params[0].grad, params[1].grad = torch.tensor([3.0, 0.0]), torch.tensor([4.0])
    assert clip_gradients(params, max_norm=1.0) == pytest.approx(5.0)
    assert math.hypot(*params[0].grad.tolist(), *params[1].grad.tolist()) == pytest.approx(1.0, rel=1e-5)
    params[0].grad = torch.tensor([float("inf"), 0.0])
    assert math.isinf(clip_gradients(params, max_norm=1.0))
