"""The device layer on whatever this host has: every test either holds on any
host (CPU, GPU, NPU) or names the hardware it needs and is skipped elsewhere.

What the host has is read here straight from torch and the import system,
not through the code under test.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch

from trainer.device import local_accelerators, resolve_device, set_deterministic_environment
from trainer.errors import TrainerConfigError

HAS_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None
HAS_CUDA = torch.cuda.is_available()


def _npu_usable() -> bool:
    """torch_npu loads (CANN present) and sees an NPU; imported only where installed."""
    if not HAS_TORCH_NPU:
        return False
    try:
        importlib.import_module("torch_npu")
    except (ImportError, OSError, RuntimeError):
        return False
    return torch.npu.is_available()  # type: ignore[attr-defined]


needs_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
needs_npu = pytest.mark.skipif(not _npu_usable(), reason="needs an Ascend NPU with CANN")
needs_no_accelerator = pytest.mark.skipif(HAS_CUDA or HAS_TORCH_NPU,
                                          reason="this host has an accelerator")


@pytest.fixture
def restore_determinism(monkeypatch):
    """Put back the global switches and variables that resolve_device sets."""
    for name in ("CUBLAS_WORKSPACE_CONFIG", "HCCL_DETERMINISTIC", "ASCEND_LAUNCH_BLOCKING"):
        monkeypatch.delenv(name, raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    cudnn = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark)
    yield
    torch.use_deterministic_algorithms(before)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn


def test_cpu_asked_for_is_cpu_and_gloo_on_any_host(restore_determinism):
    device = resolve_device("cpu", local_rank=0, deterministic=True)
    assert (device.kind, device.backend, device.autocast_type) == ("cpu", "gloo", "cpu")
    assert device.torch_device == torch.device("cpu")
    assert torch.are_deterministic_algorithms_enabled()
    device.synchronize()


def test_an_unknown_kind_names_the_choices():
    with pytest.raises(TrainerConfigError, match="device must be one of auto, cpu, cuda, npu; got 'tpu'"):
        resolve_device("tpu", local_rank=0, deterministic=False)


def test_cuda_determinism_is_set_before_the_runtime_starts(restore_determinism):
    # Only an environment variable: testable without a GPU.
    set_deterministic_environment("cuda")
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


@needs_no_accelerator
def test_auto_resolves_to_cpu_and_gloo_without_an_accelerator(restore_determinism):
    device = resolve_device("auto", local_rank=0, deterministic=False)
    assert (device.kind, device.backend) == ("cpu", "gloo")


@needs_no_accelerator
def test_no_accelerators_counted_without_one():
    assert local_accelerators() == {"npu": 0, "cuda": 0}


@pytest.mark.skipif(HAS_TORCH_NPU, reason="torch_npu is installed here")
def test_torch_npu_is_never_imported_where_it_is_absent(restore_determinism):
    resolve_device("auto", local_rank=0, deterministic=False)
    local_accelerators()
    assert "torch_npu" not in sys.modules


@pytest.mark.skipif(HAS_CUDA, reason="this host has a CUDA GPU")
def test_asking_for_a_missing_gpu_names_the_fix():
    with pytest.raises(TrainerConfigError, match="device=cuda but torch sees no CUDA device; set device=auto"):
        resolve_device("cuda", local_rank=0, deterministic=False)


@pytest.mark.skipif(HAS_TORCH_NPU, reason="torch_npu is installed here")
def test_asking_for_a_missing_npu_names_the_fix():
    with pytest.raises(TrainerConfigError, match="device=npu but torch_npu is not importable"):
        resolve_device("npu", local_rank=0, deterministic=False)


@needs_cuda
def test_cuda_resolves_to_this_ranks_gpu_and_nccl(restore_determinism):
    device = resolve_device("cuda", local_rank=0, deterministic=True)
    assert (device.kind, device.backend, device.autocast_type) == ("cuda", "nccl", "cuda")
    assert device.torch_device == torch.device("cuda", 0)
    assert torch.cuda.current_device() == 0
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    product = torch.ones(64, 64, device=device.torch_device) @ torch.ones(64, 64, device=device.torch_device)
    device.synchronize()
    assert product[0, 0].item() == 64.0


@needs_cuda
@pytest.mark.skipif(HAS_TORCH_NPU, reason="an NPU host prefers its NPUs")
def test_auto_prefers_the_gpu_on_a_gpu_host(restore_determinism):
    assert resolve_device("auto", local_rank=0, deterministic=False).kind == "cuda"
    assert local_accelerators() == {"npu": 0, "cuda": torch.cuda.device_count()}


@needs_npu
def test_auto_prefers_the_npu_on_an_ascend_host(restore_determinism):
    device = resolve_device("auto", local_rank=0, deterministic=False)
    assert (device.kind, device.backend, device.autocast_type) == ("npu", "hccl", "npu")
    assert local_accelerators()["npu"] > 0


def test_a_rank_started_by_a_big_parent_reports_its_own_peak_memory_not_the_parent_s():
    """A rank process is forked and exec'd by a driver or pytest holding hundreds of MB;
    its reported peak (what the dry-run estimate is checked against) must be its own."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    held = bytearray(600 * 2**20)  # the parent holds 600 MB, as a long test session does
    child = subprocess.run([sys.executable, "-c", "from trainer.device import peak_rss_bytes; print(peak_rss_bytes())"],
                           capture_output=True, text=True, timeout=120, check=True,
                           env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert len(held) and int(child.stdout) < 500 * 2**20  # a python with torch's device layer: ~200 MB
