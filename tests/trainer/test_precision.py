"""Mixed precision: the dynamic loss scaler of fp16 and the skipped step."""

from __future__ import annotations

import math

import pytest
import torch

from trainer.parallel.engine import plain_engine

from trainer.config import ModelConfig, PrecisionConfig, TrainerConfig
from trainer.device import Device
from trainer.distributed import DistEnv
from trainer.model import build_model
from trainer.optim import build_optimizer
from trainer.plan import ResumePlan
from trainer.precision import LossScaler, autocast
from trainer.steps import StepContext, optimizer_step

FP16 = PrecisionConfig(fp16=True, initial_loss_scale=1024.0, loss_scale_window=3, hysteresis=2, min_loss_scale=256.0)


def test_no_scaling_without_fp16():
    scaler = LossScaler.from_config(PrecisionConfig(bf16=True))
    scaler.update(overflow=True)
    assert scaler.scale == 1.0


def test_overflows_halve_the_scale_after_hysteresis_and_never_below_the_floor():
    scaler = LossScaler.from_config(FP16)
    scaler.update(overflow=True)
    assert scaler.scale == 1024.0  # first overflow tolerated (hysteresis 2)
    scaler.update(overflow=True)
    assert scaler.scale == 512.0
    scaler.update(overflow=True)
    scaler.update(overflow=True)
    assert scaler.scale == 256.0  # the floor


def test_the_scale_doubles_after_a_clean_window():
    scaler = LossScaler.from_config(FP16)
    for _ in range(3):
        scaler.update(overflow=False)
    assert scaler.scale == 2048.0
    scaler.update(overflow=False)
    scaler.update(overflow=True)  # resets the clean count
    scaler.update(overflow=False)
    scaler.update(overflow=False)
    assert scaler.scale == 2048.0


def test_state_round_trip_survives_a_resume():
    scaler = LossScaler.from_config(FP16)
    for overflow in (True, True, False):
        scaler.update(overflow)
    restored = LossScaler.from_config(FP16)
    restored.load_state_dict(scaler.state_dict())
    assert (restored.scale, restored.clean_steps, restored.overflows_left) == (512.0, 1, 0)


def context(precision: PrecisionConfig) -> StepContext:
    config = TrainerConfig(precision=precision)
    return StepContext(config, ResumePlan(), DistEnv(), Device("cpu", torch.device("cpu"), "gloo"), 0, 0)


def tiny_model():
    torch.manual_seed(0)
    return build_model(ModelConfig(num_layers=1, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2,
                                   seq_length=8, max_position_embeddings=8, vocab_size=32))


def test_an_overflowed_step_is_skipped_and_reported():
    model, ctx = tiny_model(), context(FP16)
    optimizer, scaler = build_optimizer(model, ctx.config.optim), LossScaler.from_config(FP16)
    params = list(model.parameters())
    before = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.ones_like(p)
    params[0].grad[0, 0] = float("inf")
    grad_norm, skipped = optimizer_step(plain_engine(model, optimizer, ctx.device), scaler, lr=1e-3, ctx=ctx)
    assert skipped and math.isinf(grad_norm)
    assert all(torch.equal(a, b) for a, b in zip(before, params))  # no update
    assert optimizer.state == {}


def test_a_clean_fp16_step_unscales_before_clipping_and_updates():
    model, ctx = tiny_model(), context(FP16)
    optimizer, scaler = build_optimizer(model, ctx.config.optim), LossScaler.from_config(FP16)
    params = list(model.parameters())
    tokens = torch.randint(0, 32, (2, 9))
    with autocast("cpu", FP16):
        logits = model(tokens[:, :-1])
    assert logits.dtype == torch.float16 and params[0].dtype == torch.float32  # fp32 master weights
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 32), tokens[:, 1:].reshape(-1))
    (loss * scaler.scale).backward()
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in params])) / scaler.scale
    grad_norm, skipped = optimizer_step(plain_engine(model, optimizer, ctx.device), scaler, lr=1e-3, ctx=ctx)
    assert not skipped and grad_norm == pytest.approx(float(expected), rel=1e-4)
    assert optimizer.state  # Adam took the step


def test_bf16_autocast_keeps_fp32_weights():
    model = tiny_model()
    with autocast("cpu", PrecisionConfig(bf16=True)):
        logits = model(torch.randint(0, 32, (1, 8)))
    assert logits.dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in model.parameters())
