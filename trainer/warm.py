"""Warm recovery on a rank: in-memory snapshots, and a process group re-formed
with the survivors and a replacement, in the same processes.

A rank given a :class:`WarmLink` keeps a snapshot of what it needs to resume
(weights, optimizer, loss scaler, data position) in host memory every
``checkpoint.memory_interval`` steps. When a collective fails because a peer
went away, it asks the link where the group re-forms (whoever drives the ranks
answers: runmgr's worker, or a test), re-forms it on the new rendezvous, and
the ranks agree on the newest snapshot every survivor holds; survivors roll
back to it, and each replacement receives it from its donor (a data-parallel
replica) over the new group. Nothing is read from disk and no survivor starts
a new process (torchft heals a replica from a peer the same way; NVIDIA's
resiliency extension restarts in process).

The trainer imports nothing of runmgr: the link is a protocol.
"""

from __future__ import annotations

import copy
import io
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Protocol

import torch
import torch.distributed as dist

from trainer.distributed import DistEnv, gather_floats
from trainer.plan import ResumePlan

PEER_FAILURE_SIGNS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "Read error",
                      "Timed out waiting", "gloo/transport", "ncclRemoteError", "NCCL communicator was aborted")
"""What a collective raises on this rank when another rank went away (gloo raises a plain
RuntimeError naming its transport; NCCL a DistBackendError)."""
KEPT_SNAPSHOTS = 2
"""Snapshots kept: a rank that finished a step its peer did not rolls back one more."""


def is_peer_failure(error: BaseException) -> bool:
    """True when ``error`` says another rank of the group went away, not this rank's own fault."""
    if isinstance(error, dist.DistBackendError):
        return True
    return isinstance(error, RuntimeError) and any(sign in str(error) for sign in PEER_FAILURE_SIGNS)


@dataclass(frozen=True)
class Rejoin:
    """Where the group re-forms and what this rank is in it."""

    dist_env: DistEnv
    """This rank's place in the re-formed group: same rank and world size, a new rendezvous."""
    plan: ResumePlan
    """The plan of the sub-run the re-formed group trains (its id goes on every report)."""
    donors: Mapping[int, int] = field(default_factory=dict)
    """Each replaced rank -> the rank that sends it its state (a replica of it)."""
    at_most: Optional[int] = None
    """The newest step the group may resume at: the last one the driver recorded (a resume
    past it would leave steps with no metrics). None: the newest snapshot held in common."""


class WarmLink(Protocol):
    """How a rank that keeps warm state reaches whoever drives it."""

    def rejoin(self, error: BaseException, newest_snapshot: Optional[int]) -> Optional[Rejoin]:
        """A collective failed because a peer went away: block until the driver says where the
        group re-forms. None: the driver restarts cold; the error is raised."""

    def join(self) -> Rejoin:
        """A ready spare: block until the driver names the rank it replaces."""


def _host(value: Any) -> Any:
    """A copy of ``value`` with every tensor copied to host memory."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, dict):
        return {key: _host(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_host(item) for item in value)
    return copy.deepcopy(value)


def _copy_into(kept: Any, value: Any) -> Any:
    """``value`` copied into ``kept``'s tensors where their shapes and types match (no new
    host memory: a fresh allocation's page faults cost more than the copy), else a new copy."""
    if isinstance(value, torch.Tensor):
        if isinstance(kept, torch.Tensor) and kept.shape == value.shape and kept.dtype == value.dtype:
            return kept.copy_(value.detach())
        return _host(value)
    if isinstance(value, dict):
        old = kept if isinstance(kept, dict) else {}
        return {key: _copy_into(old.get(key), item) for key, item in value.items()}
    if isinstance(value, (list, tuple)) and not (value and isinstance(value[0], (int, float))):
        old = kept if isinstance(kept, (list, tuple)) and len(kept) == len(value) else [None] * len(value)
        return type(value)(_copy_into(prior, item) for prior, item in zip(old, value))
    return _host(value)


class Snapshots:
    """This rank's newest in-memory snapshots, by step. The oldest one's memory is reused
    for the next, so a snapshot every step allocates nothing after the first two."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._kept: dict[int, dict] = {}

    def due(self, step: int) -> bool:
        return step % self.interval == 0

    def take(self, step: int, state: dict) -> None:
        """Keep a host copy of ``state`` (tensors copied) as the snapshot of ``step``."""
        recycled = None
        if len(self._kept) >= KEPT_SNAPSHOTS:
            recycled = self._kept.pop(min(self._kept))
        self._kept[step] = _copy_into(recycled, state)

    @property
    def steps(self) -> list[int]:
        return sorted(self._kept)

    def get(self, step: int) -> dict:
        """A copy of the snapshot of ``step`` (restoring must not alias what is kept)."""
        return _host(self._kept[step])

    def keep_only(self, step: int) -> None:
        """After a rollback to ``step``: newer snapshots belong to an abandoned branch."""
        self._kept = {kept: state for kept, state in self._kept.items() if kept <= step}


class NoCommonSnapshot(RuntimeError):
    """The survivors hold no snapshot in common: the driver must restart cold."""


def agree_on_step(held: list[int], replaced: set[int], world_size: int, device: torch.device,
                  at_most: Optional[int] = None) -> int:
    """The newest step, at most ``at_most``, whose snapshot every surviving rank holds (a
    collective of the new group; replaced ranks hold none)."""
    padded = ([-1.0] * KEPT_SNAPSHOTS + [float(step) for step in held])[-KEPT_SNAPSHOTS:]
    rows = gather_floats(padded, world_size, device)
    survivors = [{int(step) for step in row if step >= 0} for rank, row in enumerate(rows) if rank not in replaced]
    common = set.intersection(*survivors) if survivors else set()
    common = {step for step in common if at_most is None or step <= at_most}
    if not common:
        raise NoCommonSnapshot(f"the surviving ranks hold no snapshot in common at or before step {at_most} "
                               f"({[sorted(s) for s in survivors]})")
    return max(common)


def send_state(state: dict, destination: int) -> None:
    """Send a snapshot to ``destination`` (point to point on the default group)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)
    dist.send(torch.tensor([payload.numel()], dtype=torch.int64), destination)
    dist.send(payload, destination)


def receive_state(source: int) -> dict:
    """Receive the snapshot :func:`send_state` sent from ``source``."""
    size = torch.zeros(1, dtype=torch.int64)
    dist.recv(size, source)
    payload = torch.empty(int(size), dtype=torch.uint8)
    dist.recv(payload, source)
    return torch.load(io.BytesIO(payload.numpy().tobytes()), weights_only=True)
