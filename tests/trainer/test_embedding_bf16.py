"""precision.embedding_bf16: the embedding kept in bf16 (seed 004's forward-stage
case), honoured by the model and the loop, refused where Megatron cannot run it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from trainer import DistEnv, TrainerConfig, train
from trainer.cli import config_from_dict
from trainer.config import ModelConfig, OptimConfig, PrecisionConfig
from trainer.errors import TrainerConfigError
from trainer.megatron_args import to_megatron_args, without_megatron_flag
from trainer.model import build_model
from trainer.precision import embedding_dtype

MODEL = ModelConfig(num_layers=1, hidden_size=16, ffn_hidden_size=32, num_attention_heads=2, seq_length=8,
                    max_position_embeddings=8, vocab_size=32)


def twins(**model_changes) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The same initial weights, with the embedding kept in fp32 and in bf16."""
    cfg = dataclasses.replace(MODEL, **model_changes)
    torch.manual_seed(0)
    fp32 = build_model(cfg, embedding_dtype(PrecisionConfig()))
    torch.manual_seed(0)
    bf16 = build_model(cfg, embedding_dtype(PrecisionConfig(embedding_bf16=True)))
    return fp32, bf16


def test_the_forward_pass_sees_the_embedding_rounded_to_bf16_and_the_master_weight_stays_fp32():
    fp32, bf16 = twins()
    tokens = torch.randint(0, MODEL.vocab_size, (2, MODEL.seq_length), generator=torch.Generator().manual_seed(1))
    assert bf16.embedding.weight.dtype == torch.float32
    assert not torch.equal(fp32(tokens), bf16(tokens))
    with torch.no_grad():  # the fp32 model given the bf16 rounding of its own embedding computes the same logits
        fp32.embedding.weight.copy_(fp32.embedding.weight.to(torch.bfloat16).float())
    assert torch.equal(fp32(tokens), bf16(tokens))


def test_its_gradient_reaches_the_fp32_master_weight_and_differs_from_the_fp32_embeddings():
    fp32, bf16 = twins(untie_embeddings_and_output_weights=True)  # the lookup's own gradient, no output projection
    tokens = torch.randint(0, MODEL.vocab_size, (4, MODEL.seq_length), generator=torch.Generator().manual_seed(2))
    for model in (fp32, bf16):
        model(tokens).square().mean().backward()
    grad = bf16.embedding.weight.grad
    assert grad is not None and grad.dtype == torch.float32
    assert not torch.equal(grad, fp32.embedding.weight.grad)
    assert torch.equal(grad, grad.to(torch.bfloat16).float())  # accumulated in bf16


def test_off_by_default_leaves_the_model_bit_for_bit_as_before():
    assert embedding_dtype(PrecisionConfig()) == torch.float32
    torch.manual_seed(0)
    plain = build_model(MODEL)
    fp32, _ = twins()
    tokens = torch.arange(MODEL.seq_length).unsqueeze(0)
    assert torch.equal(plain(tokens), fp32(tokens))


def test_the_loop_honours_it(tmp_path):
    def first_loss(embedding_bf16: bool) -> float:
        config = config_from_dict({
            "device": "cpu",
            "model": dataclasses.asdict(MODEL) | {"family": "llama", "vocab_size": 256},
            "precision": {"embedding_bf16": embedding_bf16},
            "data": {"corpus_max_bytes": 100_000},
            "training": {"micro_batch_size": 2, "global_batch_size": 2, "train_iters": 1, "seed": 3},
        })
        return train(config, dist_env=DistEnv()).losses[0]

    assert first_loss(True) != first_loss(False)


@pytest.mark.parametrize("config, key", [
    (TrainerConfig(precision=PrecisionConfig(embedding_bf16=True)), "precision.embedding_bf16"),
    (TrainerConfig(optim=OptimConfig(decay_1d_weights=True)), "optim.decay_1d_weights"),
])
def test_megatron_has_no_flag_for_it_so_the_dialect_refuses_it_with_one_line(config, key):
    line = without_megatron_flag(config)
    assert line is not None and f"{key}=true has no Megatron flag" in line and f"set {key}=false" in line
    with pytest.raises(TrainerConfigError, match="has no Megatron flag") as caught:
        to_megatron_args(config)
    assert "\n" not in str(caught.value)
    assert without_megatron_flag(TrainerConfig()) is None
