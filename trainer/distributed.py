"""Process groups and the few collectives of data-parallel training.

Gradients are averaged with ONE flat all-reduce per step (no DDP buckets):
the reduction order is then fixed by the world size alone, which keeps runs
reproducible bit for bit, and every rank ends with identical gradients.
"""

from __future__ import annotations

import contextlib
import os
from datetime import timedelta
from typing import Iterator

import torch
import torch.distributed as dist

from trainer.dist_env import DistEnv

_LOOPBACK = ("127.0.0.1", "localhost")


@contextlib.contextmanager
def _gloo_on_loopback(env: DistEnv, backend: str) -> Iterator[None]:
    """Bind gloo to ``lo`` while groups are created, when every peer is on this
    machine; otherwise gloo may pick an interface the peers cannot reach
    (ENVIRONMENT.md). Restored afterwards: an actor process may next join a
    multi-node group."""
    if backend != "gloo" or env.master_addr not in _LOOPBACK or "GLOO_SOCKET_IFNAME" in os.environ:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)


def init_process_groups(env: DistEnv, backend: str, timeout_s: float) -> dist.ProcessGroup:
    """Start the default group and return a second, gloo-only group for
    checkpoints (async saves on the default group deadlock against training
    collectives)."""
    timeout = timedelta(seconds=timeout_s)
    with _gloo_on_loopback(env, backend):
        if env.world_size == 1:
            # One process: an in-memory store, no port to collide with.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
        else:
            dist.init_process_group(
                backend,
                init_method=f"tcp://{env.master_addr}:{env.master_port}",
                rank=env.rank,
                world_size=env.world_size,
                timeout=timeout,
            )
        return dist.new_group(backend="gloo", timeout=timeout)


def destroy_process_groups() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def _flat_copy_back(flat: torch.Tensor, tensors: list[torch.Tensor]) -> None:
    offset = 0
    for tensor in tensors:
        count = tensor.numel()
        tensor.copy_(flat[offset:offset + count].view_as(tensor))
        offset += count


def average_gradients(params: list[torch.nn.Parameter], world_size: int) -> None:
    """Replace each gradient by its mean over the data-parallel ranks."""
    if world_size == 1:
        return
    grads = []
    for param in params:
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        grads.append(param.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat.div_(world_size)
    _flat_copy_back(flat, grads)


def broadcast_parameters(params: list[torch.nn.Parameter], world_size: int) -> None:
    """Make every replica start from rank 0's weights."""
    if world_size == 1:
        return
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1) for p in params])
        dist.broadcast(flat, src=0)
        _flat_copy_back(flat, [p.data for p in params])


def gather_floats(values: list[float], world_size: int, device: torch.device) -> list[list[float]]:
    """Every rank's ``values`` (same length on all ranks), index = rank."""
    # float32: every backend (gloo, NCCL, HCCL) gathers it.
    local = torch.tensor(values, dtype=torch.float32, device=device)
    if world_size == 1:
        return [local.tolist()]
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local)
    return [part.tolist() for part in parts]


def gather_ints(value: int, world_size: int, device: torch.device) -> list[int]:
    """Every rank's ``value``, index = rank (int64: byte counts stay exact)."""
    local = torch.tensor([value], dtype=torch.int64, device=device)
    if world_size == 1:
        return [value]
    parts = [torch.empty_like(local) for _ in range(world_size)]
    dist.all_gather(parts, local)
    return [int(part) for part in parts]
