"""FLOPs per token from the model's shape (PaLM's 6N + 12 L h s, as torchtitan and
Megatron report MFU), the device's dense peak by name, and MFU from the two."""

from __future__ import annotations

import pytest

from trainer.config import ModelConfig
from trainer.device import Device, peak_flops_of, peak_rss_bytes
from trainer.flops import flops_per_token, matmul_parameters, mfu
from trainer.shapes import parameter_count

import torch


def test_flops_per_token_is_six_n_plus_the_attention_term():
    cfg = ModelConfig(num_layers=2, hidden_size=64, ffn_hidden_size=172, num_attention_heads=4, seq_length=64,
                      max_position_embeddings=64, vocab_size=256, untie_embeddings_and_output_weights=True)
    # Untied: the input embedding is a lookup (no FLOPs); the output projection multiplies.
    n = parameter_count(cfg) - 256 * 64
    assert matmul_parameters(cfg) == n
    assert flops_per_token(cfg) == 6 * n + 12 * 2 * 64 * 64


def test_a_tied_embedding_counts_once_as_the_output_projection():
    tied = ModelConfig(untie_embeddings_and_output_weights=False)
    assert matmul_parameters(tied) == parameter_count(tied)


def test_learned_positions_are_a_lookup():
    opt = ModelConfig(family="opt", untie_embeddings_and_output_weights=False)
    assert matmul_parameters(opt) == parameter_count(opt) - opt.max_position_embeddings * opt.hidden_size


@pytest.mark.parametrize("name, precision, peak", [
    ("NVIDIA H100 80GB HBM3", "bf16", 989.4e12),
    ("NVIDIA H100 PCIe", "bf16", 756e12),
    ("NVIDIA H200", "bf16", 989.4e12),
    ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
    ("NVIDIA A100-SXM4-80GB", "fp32", 19.5e12),
    ("Ascend910B3", "fp16", 313e12),
    ("Ascend910B4", "bf16", 280e12),
    ("Ascend910B3", "fp32", None),
    ("Tesla T4", "fp16", None),
])
def test_the_peak_comes_from_the_device_table_by_name(name, precision, peak):
    assert peak_flops_of(name, precision) == peak


def test_a_cpu_has_no_peak_so_no_mfu_and_measures_its_peak_rss():
    cpu = Device("cpu", torch.device("cpu"), "gloo")
    assert cpu.peak_flops("fp32") is None
    assert mfu(1e6, 1e9, cpu.peak_flops("fp32"), 4) is None
    # Another thread of this process (a test runner's) may grow the peak between two reads.
    assert 10 * 2**20 < cpu.peak_memory_bytes() <= peak_rss_bytes()  # torch alone is tens of MiB


def test_mfu_is_model_flops_over_the_devices_peak():
    assert mfu(tokens_per_s=1000.0, per_token=1e9, peak_per_device=1e12, devices=2) == pytest.approx(0.5)
