"""Compute speed of one device: matrix-multiply TFLOP/s in the run's dtype and
memory bandwidth (GB/s), measured with torch. The clock is injected so the
arithmetic can be tested; the device is a parameter, never guessed here."""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch

from health.config import ComputeChecks
from health.findings import ProbeResult, fail, ok

Clock = Callable[[], float]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ComputeProbeError(ValueError):
    """The compute probe was asked for something it cannot run (bad dtype or device)."""


def _synchronize(device: torch.device) -> None:
    # Accelerators queue kernels asynchronously: wait for them before reading the clock.
    if device.type != "cpu":
        torch.get_device_module(device.type).synchronize()


def _best_seconds(work: Callable[[], object], device: torch.device, repeats: int,
                  clock: Clock) -> float:
    work()  # warm-up: allocation, kernel selection, caches
    _synchronize(device)
    best = float("inf")
    for _ in range(repeats):
        start = clock()
        work()
        _synchronize(device)
        best = min(best, clock() - start)
    return max(best, 1e-12)


def resolve_dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ComputeProbeError(
            f"health.compute.dtype: unknown dtype {name!r}; use one of {', '.join(_DTYPES)}")
    return _DTYPES[name]


def benchmark_device(device: str) -> torch.device:
    """``auto``: the accelerator torch sees on this node (a GPU, or an NPU through its
    plugin), else the CPU; anything else as torch spells it (``cuda:0``)."""
    if device != "auto":
        return torch.device(device)
    if torch.accelerator.is_available():
        return torch.device(torch.accelerator.current_accelerator().type, 0)
    return torch.device("cpu")


def matmul_tflops(device: str = "cpu", dtype: str = "float32", size: int = 1024,
                  repeats: int = 5, clock: Clock = time.perf_counter) -> float:
    """Best-of-``repeats`` TFLOP/s of a ``size`` x ``size`` matmul (2 n^3 flops)."""
    dev = torch.device(device)
    kind = resolve_dtype(dtype)
    a = torch.randn(size, size, device=dev).to(kind)
    b = torch.randn(size, size, device=dev).to(kind)
    seconds = _best_seconds(lambda: torch.mm(a, b), dev, repeats, clock)
    return 2.0 * size ** 3 / seconds / 1e12


def memory_gbps(device: str = "cpu", megabytes: float = 64.0, repeats: int = 5,
                clock: Clock = time.perf_counter) -> float:
    """Best-of-``repeats`` copy bandwidth in GB/s (bytes read plus bytes written)."""
    dev = torch.device(device)
    count = max(1, int(megabytes * 1e6) // 4)
    source = torch.ones(count, dtype=torch.float32, device=dev)
    target = torch.empty_like(source)
    seconds = _best_seconds(lambda: target.copy_(source), dev, repeats, clock)
    return 2.0 * count * 4 / seconds / 1e9


@contextmanager
def cpu_threads(device: str, threads: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` while a CPU benchmark runs."""
    if torch.device(device).type != "cpu":
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def probe_compute(checks: ComputeChecks, clock: Clock = time.perf_counter) -> ProbeResult:
    """Measure both figures; an unusable device fails the node with the reason."""
    try:
        device = str(benchmark_device(checks.device))
        with cpu_threads(device, checks.cpu_threads):
            tflops, gbps = _measure(device, checks, clock)
    # torch reports a broken or unknown device with RuntimeError, and a backend
    # missing from this build (CUDA on a CPU wheel) with AssertionError.
    except (RuntimeError, AssertionError) as exc:
        return ProbeResult([fail("compute.device_error",
                                 f"the compute benchmark failed on {checks.device}: {exc}",
                                 device=checks.device)])
    figures = {"compute.matmul_tflops": tflops, "compute.memory_gbps": gbps}
    return ProbeResult(
        [ok("compute.measured", f"{device} {checks.dtype}: {tflops:.3f} TFLOP/s matmul, "
            f"{gbps:.1f} GB/s copy", device=device, dtype=checks.dtype)],
        figures, {"compute.device": device, "compute.dtype": checks.dtype})


def _measure(device: str, checks: ComputeChecks, clock: Clock) -> tuple[float, float]:
    tflops = matmul_tflops(device, checks.dtype, checks.matmul_size, checks.repeats, clock)
    return tflops, memory_gbps(device, checks.bandwidth_mb, checks.repeats, clock)
