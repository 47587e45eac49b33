"""The one place that names device kinds (npu, cuda, cpu).

Everything else in the trainer asks a :class:`Device` for what it needs: the
torch device of this rank, the collective backend, the autocast device type,
a synchronize, and the deterministic switches. ``torch_npu`` is imported only
here and only lazily: installed without Ascend CANN it breaks ``import torch``
at import time (ENVIRONMENT.md), so nothing may import it at module level.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Optional

import torch

from trainer.errors import TrainerConfigError

_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl"}


@dataclass(frozen=True)
class Device:
    """Where this rank computes and how it talks to its peers."""

    kind: str
    """``cpu``, ``cuda`` or ``npu``."""
    torch_device: torch.device
    """The device of this rank (``cuda:<local_rank>``, ``npu:<local_rank>``, ``cpu``)."""
    backend: str
    """torch.distributed backend of the training collectives."""

    @property
    def autocast_type(self) -> str:
        """``device_type`` argument of :func:`torch.autocast`."""
        return self.kind

    def synchronize(self) -> None:
        """Wait for queued kernels, so that wall-clock timings mean something."""
        if self.kind == "cuda":
            torch.cuda.synchronize(self.torch_device)
        elif self.kind == "npu":
            torch.npu.synchronize(self.torch_device)  # type: ignore[attr-defined]


def _import_torch_npu() -> Optional[ModuleType]:
    """``torch_npu`` when it is installed and loads (CANN present), else None."""
    if importlib.util.find_spec("torch_npu") is None:
        return None
    try:
        return importlib.import_module("torch_npu")
    except (ImportError, OSError, RuntimeError):
        # Installed without CANN: libhccl.so is missing. Not an NPU host.
        return None


def _npu_available() -> bool:
    return _import_torch_npu() is not None and torch.npu.is_available()  # type: ignore[attr-defined]


def local_accelerators() -> dict[str, int]:
    """Accelerators this machine has, by kind (``npu``, ``cuda``); 0 when none."""
    npus = torch.npu.device_count() if _npu_available() else 0  # type: ignore[attr-defined]
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return {"npu": npus, "cuda": gpus}


def detect_kind(requested: str) -> str:
    """Resolve ``auto`` to the best available kind; check an explicit one exists."""
    if requested == "auto":
        if _npu_available():
            return "npu"
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise TrainerConfigError("device=cuda but torch sees no CUDA device; set device=auto or device=cpu")
    if requested == "npu" and not _npu_available():
        raise TrainerConfigError(
            "device=npu but torch_npu is not importable or sees no NPU (is CANN installed?); set device=auto or device=cpu"
        )
    if requested not in _BACKENDS:
        raise TrainerConfigError(f"device must be one of auto, {', '.join(_BACKENDS)}; got {requested!r}")
    return requested


def set_deterministic_environment(kind: str) -> None:
    """Environment switches that must be set before the device's runtime
    starts (cuBLAS workspace, HCCL's deterministic reductions; seed 004)."""
    if kind == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    elif kind == "npu":
        os.environ["HCCL_DETERMINISTIC"] = "true"
        os.environ["ASCEND_LAUNCH_BLOCKING"] = "1"


def enable_deterministic_algorithms(kind: str) -> None:
    """Make kernels deterministic: an op without a deterministic version raises
    instead of silently breaking bit-for-bit resumes."""
    torch.use_deterministic_algorithms(True, warn_only=False)
    if kind == "cuda":
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False


def resolve_device(requested: str, local_rank: int, deterministic: bool) -> Device:
    """The :class:`Device` of the rank with ``local_rank`` on its node."""
    kind = detect_kind(requested)
    if deterministic:
        set_deterministic_environment(kind)
    if kind == "cuda":
        torch.cuda.set_device(local_rank)
        torch_device = torch.device("cuda", local_rank)
    elif kind == "npu":
        torch.npu.set_device(local_rank)  # type: ignore[attr-defined]
        torch_device = torch.device("npu", local_rank)
    else:
        torch_device = torch.device("cpu")
    if deterministic:
        enable_deterministic_algorithms(kind)
    return Device(kind=kind, torch_device=torch_device, backend=_BACKENDS[kind])
