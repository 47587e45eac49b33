"""All-reduce bandwidth of the current torch.distributed group, measured the
way nccl-tests reports it (bus bandwidth), with whatever backend the run uses
(gloo, NCCL, HCCL). The caller forms the group (see :mod:`health.groups`)."""

from __future__ import annotations

import time
from typing import Callable, Optional

import torch
import torch.distributed as dist

Clock = Callable[[], float]


def bus_bandwidth_gbps(nbytes: int, seconds: float, world_size: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: algbw x 2(n-1)/n, in GB/s.

    The factor makes figures comparable across group sizes: it is the traffic
    each link carries in a ring all-reduce.
    """
    if world_size < 2:
        return 0.0
    return nbytes / max(seconds, 1e-12) / 1e9 * 2.0 * (world_size - 1) / world_size


def allreduce_busbw_gbps(megabytes: float = 16.0, iterations: int = 5,
                         group: Optional[dist.ProcessGroup] = None,
                         device: str = "cpu", clock: Clock = time.perf_counter) -> float:
    """Best-of-``iterations`` bus bandwidth of an all-reduce on ``group``.

    Every member must call this at the same time with the same arguments; all
    get the same figure (the slowest member's timing). With a non-CPU backend
    (NCCL, HCCL), ``device`` must be the member's accelerator and the timing
    tensor lives there too.
    """
    count = max(1, int(megabytes * 1e6) // 4)
    tensor = torch.ones(count, dtype=torch.float32, device=torch.device(device))
    dist.all_reduce(tensor, group=group)  # warm-up: connections, buffers
    best = float("inf")
    for _ in range(iterations):
        dist.barrier(group=group)
        start = clock()
        dist.all_reduce(tensor, group=group)
        if tensor.device.type != "cpu":
            torch.get_device_module(tensor.device.type).synchronize()
        best = min(best, clock() - start)
    # Agree on one figure: the slowest member's view is the group's bandwidth.
    agreed = torch.tensor([best], dtype=torch.float32, device=tensor.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX, group=group)
    return bus_bandwidth_gbps(count * 4, float(agreed.item()), dist.get_world_size(group))
