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
import resource
import sys
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

    @property
    def name(self) -> str:
        """The device's product name (``NVIDIA H100 80GB HBM3``, ``Ascend910B3``); ``cpu`` on CPU."""
        if self.kind == "cuda":
            return torch.cuda.get_device_name(self.torch_device)
        if self.kind == "npu":
            return torch.npu.get_device_name(self.torch_device)  # type: ignore[attr-defined]
        return "cpu"

    def peak_flops(self, precision: str) -> Optional[float]:
        """Dense peak FLOP/s of one device at ``precision`` (``bf16``, ``fp16``, ``fp32``) from
        :data:`PEAK_FLOPS`; None when unknown (a CPU, a device not in the table): no MFU then."""
        return peak_flops_of(self.name, precision) if self.kind != "cpu" else None

    def peak_memory_bytes(self) -> int:
        """The most memory this rank has held so far, in bytes: the allocator's peak on a
        device; on CPU the process's peak resident set (it includes the torch runtime)."""
        if self.kind == "cuda":
            return int(torch.cuda.max_memory_allocated(self.torch_device))
        if self.kind == "npu":
            return int(torch.npu.max_memory_allocated(self.torch_device))  # type: ignore[attr-defined]
        return peak_rss_bytes()

    def memory_in_use_bytes(self) -> int:
        """Memory this rank holds now, in bytes: the allocator's on a device, the process's
        resident set on CPU (the baseline that :meth:`peak_memory_bytes` grows from)."""
        if self.kind == "cuda":
            return int(torch.cuda.memory_allocated(self.torch_device))
        if self.kind == "npu":
            return int(torch.npu.memory_allocated(self.torch_device))  # type: ignore[attr-defined]
        return rss_bytes()

    def synchronize(self) -> None:
        """Wait for queued kernels, so that wall-clock timings mean something."""
        if self.kind == "cuda":
            torch.cuda.synchronize(self.torch_device)
        elif self.kind == "npu":
            torch.npu.synchronize(self.torch_device)  # type: ignore[attr-defined]


PEAK_FLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # (a piece of the device name, peak dense FLOP/s by precision); the first match wins, so
    # the more specific names come first. No sparsity: MFU counts dense model FLOPs.
    # NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100, "Tensor Core" figures are
    # with sparsity: halved here): SXM bf16/fp16 989.4 TF, fp32 67 TF; PCIe 756 TF, fp32 51 TF;
    # NVL 835 TF, fp32 60 TF. H200 (nvidia.com/en-us/data-center/h200) has the H100 SXM's cores.
    ("H100 PCIe", {"bf16": 756e12, "fp16": 756e12, "fp32": 51e12}),
    ("H100 NVL", {"bf16": 835e12, "fp16": 835e12, "fp32": 60e12}),
    ("H100", {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 67e12}),
    ("H200", {"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 67e12}),
    # NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): bf16/fp16 312 TF dense, fp32 19.5 TF.
    ("A100", {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
    # Huawei Atlas 800T A2 / Ascend 910B (e.hihuawei / hiascend.com product pages, as quoted by
    # MindSpeed's MFU tables): 910B4 280 TF fp16, the other 910B 313 TF fp16; bf16 the same
    # cube units. No fp32 figure is published: unknown.
    ("910B4", {"bf16": 280e12, "fp16": 280e12}),
    ("910B", {"bf16": 313e12, "fp16": 313e12}),
)
"""Peak dense FLOP/s of known accelerators, by a piece of their product name."""


def peak_flops_of(name: str, precision: str) -> Optional[float]:
    """The :data:`PEAK_FLOPS` entry for the device called ``name`` at ``precision``; None when unknown."""
    for piece, peaks in PEAK_FLOPS:
        if piece.lower() in name.lower():
            return peaks.get(precision)
    return None


def peak_rss_bytes() -> int:
    """This process's peak resident set size in bytes: ``VmHWM`` of ``/proc/self/status``
    on Linux, else ``getrusage`` (bytes on macOS). Not ``ru_maxrss`` on Linux: a process
    started by fork and exec keeps its parent's peak there (a rank started by a 770 MB
    pytest read 770 MB), while VmHWM belongs to the process's own memory map."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass  # no /proc (macOS): getrusage below
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def rss_bytes() -> int:
    """This process's resident set size now, in bytes (``/proc/self/statm``; where there is
    none, the peak so far)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return peak_rss_bytes()


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
