"""The device layer on this CPU-only machine."""

from __future__ import annotations

import sys

import pytest
import torch

from trainer.device import local_accelerators, resolve_device
from trainer.errors import TrainerConfigError


@pytest.fixture
def restore_determinism():
    before = torch.are_deterministic_algorithms_enabled()
    yield
    torch.use_deterministic_algorithms(before)


def test_auto_resolves_to_cpu_and_gloo_here(restore_determinism):
    device = resolve_device("auto", local_rank=0, deterministic=True)
    assert (device.kind, device.backend, device.autocast_type) == ("cpu", "gloo", "cpu")
    assert device.torch_device == torch.device("cpu")
    assert torch.are_deterministic_algorithms_enabled()
    device.synchronize()


def test_torch_npu_is_never_imported_where_it_is_absent(restore_determinism):
    resolve_device("auto", local_rank=0, deterministic=False)
    local_accelerators()
    assert "torch_npu" not in sys.modules


def test_asking_for_a_missing_accelerator_names_the_fix():
    with pytest.raises(TrainerConfigError, match="device=cuda but torch sees no CUDA device; set device=auto"):
        resolve_device("cuda", local_rank=0, deterministic=False)
    with pytest.raises(TrainerConfigError, match="device=npu but torch_npu is not importable"):
        resolve_device("npu", local_rank=0, deterministic=False)


def test_no_accelerators_counted_here():
    assert local_accelerators() == {"npu": 0, "cuda": 0}
