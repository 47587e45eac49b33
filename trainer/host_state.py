"""A rank's state as one block of host memory, and its transfer between ranks.

A :class:`HostState` is a nested state (dicts, lists, tuples, tensors and
plain values, as ``state_dict()`` returns them) whose tensors' bytes all live
in one flat host buffer; the rest is a small *skeleton* naming each tensor's
place in the buffer. Taking a copy is one pass of tensor copies into the
buffer (reused from the previous copy of the same shapes: no allocation, no
page faults), and sending it to another rank is two messages, the skeleton
and the buffer, whatever the number of tensors.

DTensors (tensor parallel, FSDP2, ZeRO-1's sharded moments) are kept as this
rank's local part: a copy is what this rank holds, nothing more, and is put
back into a model and optimizer built on the same layout
(:func:`load_local_parts`).

Transfers go over a gloo group of host tensors: on NCCL or HCCL the default
group carries device tensors only.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from trainer.parallel.gradients import local_part

ALIGN = 64
"""Byte alignment of every tensor in the buffer (any dtype's view of a slice is then valid)."""
_TENSOR = "__host_tensor__"
"""The skeleton's marker of a tensor: ``{_TENSOR: (offset, dtype name, shape)}`` (no state key is this)."""
_SIZES_TAG, _SKELETON_TAG, _BUFFER_TAG = 71, 72, 73
"""Message tags of a transfer (distinct, so that the messages of one transfer never cross)."""

CopyPart = Callable[[Any, list[torch.Tensor], list[torch.Tensor]], None]
"""Copies one part of a state (its name, destinations, sources): :func:`copy_part` unless a test
wants to stop half-way."""


def copy_part(part: Any, destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy one part's ``sources`` into ``destinations``."""
    copy_tensors(destinations, sources)


def copy_tensors(destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """Copy ``sources`` into ``destinations`` (one fused call: the Python cost is per call, not per tensor)."""
    if destinations:
        torch._foreach_copy_(destinations, sources)


Slot = tuple[int, torch.dtype, tuple[int, ...]]
"""Where a tensor lives in the buffer: byte offset, dtype, shape."""


@dataclass
class HostState:
    """A nested state whose tensors live in one host buffer (see the module's doc)."""

    skeleton: Any
    """The state with each tensor replaced by ``{_TENSOR: i}``, the index of its slot."""
    slots: list[Slot]
    """Each tensor's place in :attr:`buffer`, by index."""
    buffer: torch.Tensor
    """uint8, every tensor's bytes, each at an :data:`ALIGN`-ed offset."""
    views: list[torch.Tensor]
    """Each tensor's view of :attr:`buffer`, by index."""

    @property
    def nbytes(self) -> int:
        return self.buffer.numel()

    def unpack(self) -> Any:
        """The state, with every tensor a fresh copy (what is kept must not be aliased)."""
        return _rebuild(self.skeleton, lambda index: self.views[index].clone())


def _walk(state: Any, tensors: list[torch.Tensor]) -> Any:
    """The skeleton of ``state``; its tensors' local parts appended to ``tensors``."""
    if isinstance(state, torch.Tensor):
        tensors.append(local_part(state))
        return {_TENSOR: len(tensors) - 1}
    if isinstance(state, dict):
        return {key: _walk(value, tensors) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_walk(value, tensors) for value in state)
    return state


def _rebuild(skeleton: Any, tensor: Callable[[int], torch.Tensor]) -> Any:
    if isinstance(skeleton, dict):
        if _TENSOR in skeleton:
            return tensor(skeleton[_TENSOR])
        return {key: _rebuild(value, tensor) for key, value in skeleton.items()}
    if isinstance(skeleton, (list, tuple)):
        return type(skeleton)(_rebuild(value, tensor) for value in skeleton)
    return skeleton


def _slots(tensors: list[torch.Tensor]) -> tuple[list[Slot], int]:
    """Each tensor's slot, and the buffer's size."""
    slots, size = [], 0
    for tensor in tensors:
        slots.append((size, tensor.dtype, tuple(tensor.shape)))
        size += -(-tensor.numel() * tensor.dtype.itemsize // ALIGN) * ALIGN
    return slots, size


def _views(buffer: torch.Tensor, slots: list[Slot]) -> list[torch.Tensor]:
    views = []
    for offset, dtype, shape in slots:
        count = 1
        for dim in shape:
            count *= dim
        views.append(buffer[offset:offset + count * dtype.itemsize].view(dtype).view(shape))
    return views


def take(state: Any, reuse: Optional[HostState] = None, copy: CopyPart = copy_part, pin: bool = False) -> HostState:
    """A host copy of ``state`` (DTensors: their local parts), into ``reuse``'s buffer when its
    tensors have the same shapes and types. ``copy`` copies one part's tensors (the parts are
    the top-level entries of a dict state, in order). ``pin``: a new buffer is page-locked
    (an accelerator copies into it at the link's speed, without staging; needs one)."""
    parts = list(state.items()) if isinstance(state, dict) else [(None, state)]
    skeletons, tensors, bounds = {}, [], []
    for key, value in parts:
        skeletons[key] = _walk(value, tensors)
        bounds.append(len(tensors))
    if reuse is not None and _fits(reuse, tensors):
        slots, buffer, views = reuse.slots, reuse.buffer, reuse.views
    else:
        slots, size = _slots(tensors)
        buffer = torch.empty(size, dtype=torch.uint8, pin_memory=pin)
        views = _views(buffer, slots)
    start = 0
    with torch.no_grad():
        for (key, _value), end in zip(parts, bounds):
            copy(key, views[start:end], tensors[start:end])
            start = end
    return HostState(skeletons if isinstance(state, dict) else skeletons[None], slots, buffer, views)


def _fits(kept: HostState, tensors: list[torch.Tensor]) -> bool:
    """Whether ``tensors`` have ``kept``'s slots' types and shapes, in order."""
    return len(kept.slots) == len(tensors) and all(
        dtype == tensor.dtype and shape == tensor.shape for (_offset, dtype, shape), tensor in zip(kept.slots, tensors))


def _encode(state: HostState, extra: Any) -> torch.Tensor:
    """The skeleton, the slots and ``extra`` (plain values) as bytes, for a peer's :func:`_decode`."""
    buffer = io.BytesIO()
    slots = [(offset, str(dtype).removeprefix("torch."), list(shape)) for offset, dtype, shape in state.slots]
    torch.save({"skeleton": state.skeleton, "slots": slots, "extra": extra}, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _decode(payload: torch.Tensor, buffer: torch.Tensor) -> tuple[HostState, Any]:
    # weights_only: a peer's bytes are data, never code (nothing but plain values is unpickled).
    try:
        loaded = torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)
    except pickle.UnpicklingError as error:
        raise ValueError(f"a peer sent a state that is not plain data: {error}") from None
    slots = [(int(offset), _dtype(name), tuple(shape)) for offset, name, shape in loaded["slots"]]
    return HostState(loaded["skeleton"], slots, buffer, _views(buffer, slots)), loaded["extra"]


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"a peer sent a state with an unknown dtype {name!r}")
    return dtype


def send(state: HostState, destination: int, group: Optional[dist.ProcessGroup], extra: Any = None) -> None:
    """Send ``state`` (and plain ``extra``) to ``destination`` of ``group``, for :func:`receive`."""
    for work in _post_send(state, destination, group, extra):
        work.wait()


def receive(source: int, group: Optional[dist.ProcessGroup], reuse: Optional[HostState] = None) -> tuple[HostState, Any]:
    """What :func:`send` sent from ``source``: the state (into ``reuse``'s buffer when it fits) and its extra."""
    sizes = torch.zeros(2, dtype=torch.int64)
    dist.recv(sizes, _global(source, group), group=group, tag=_SIZES_TAG)
    skeleton_bytes, buffer = _receive_buffers(sizes, reuse)
    works = [dist.irecv(skeleton_bytes, _global(source, group), group=group, tag=_SKELETON_TAG),
             dist.irecv(buffer, _global(source, group), group=group, tag=_BUFFER_TAG)]
    for work in works:
        work.wait()
    return _decode(skeleton_bytes, buffer)


def exchange(state: HostState, destination: int, source: int, group: Optional[dist.ProcessGroup],
             reuse: Optional[HostState] = None, extra: Any = None) -> tuple[HostState, Any]:
    """Send ``state`` to ``destination`` while receiving ``source``'s (a ring of buddies: every rank
    sends and receives at once, so nobody waits for a receiver that is itself sending)."""
    sizes_in = torch.zeros(2, dtype=torch.int64)
    receiving = dist.irecv(sizes_in, _global(source, group), group=group, tag=_SIZES_TAG)
    sending = _post_send(state, destination, group, extra)
    receiving.wait()
    skeleton_bytes, buffer = _receive_buffers(sizes_in, reuse)
    works = [dist.irecv(skeleton_bytes, _global(source, group), group=group, tag=_SKELETON_TAG),
             dist.irecv(buffer, _global(source, group), group=group, tag=_BUFFER_TAG)]
    for work in [*sending, *works]:
        work.wait()
    return _decode(skeleton_bytes, buffer)


def _post_send(state: HostState, destination: int, group: Optional[dist.ProcessGroup], extra: Any) -> list:
    header = _encode(state, extra)
    sizes = torch.tensor([header.numel(), state.nbytes], dtype=torch.int64)
    peer = _global(destination, group)
    return [dist.isend(sizes, peer, group=group, tag=_SIZES_TAG),
            dist.isend(header, peer, group=group, tag=_SKELETON_TAG),
            dist.isend(state.buffer, peer, group=group, tag=_BUFFER_TAG)]


def _receive_buffers(sizes: torch.Tensor, reuse: Optional[HostState]) -> tuple[torch.Tensor, torch.Tensor]:
    header_size, buffer_size = int(sizes[0]), int(sizes[1])
    buffer = reuse.buffer if reuse is not None and reuse.nbytes == buffer_size else torch.empty(buffer_size,
                                                                                                 dtype=torch.uint8)
    return torch.empty(header_size, dtype=torch.uint8), buffer


def _global(rank: int, group: Optional[dist.ProcessGroup]) -> int:
    """The global rank of ``group``'s ``rank`` (point-to-point calls take global ranks)."""
    return rank if group is None else dist.get_global_rank(group, rank)


def load_local_parts(targets: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    """Copy each saved local part into the local part of the target of the same name, in place
    (a model built on the same layout: its state_dict's tensors are its parameters)."""
    missing = sorted(set(targets) ^ set(saved))
    if missing:
        raise KeyError(f"the snapshot and the model differ in {missing[:3]}")
    with torch.no_grad():
        copy_tensors([local_part(targets[name]) for name in targets], [saved[name] for name in targets])
