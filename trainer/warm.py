"""Warm recovery on a rank: in-memory snapshots, and a process group re-formed
with the survivors and a replacement, in the same processes.

A rank given a :class:`trainer.rejoin.WarmLink` keeps a snapshot of what it needs to resume
(weights, optimizer, loss scaler, data position) in host memory every
``checkpoint.memory_interval`` steps. When a collective fails because a peer
went away, it asks the link where the group re-forms (whoever drives the ranks
answers: runmgr's worker, or a test), re-forms it on the new rendezvous, and
the ranks agree on the newest snapshot the re-formed group can resume from;
survivors roll back to it, and each replacement receives it from its donor
over the new group. Nothing is read from disk and no survivor starts a new
process (torchft heals a replica from a peer the same way; NVIDIA's
resiliency extension restarts in process).

Who holds a rank's snapshot: in plain data parallel every replica holds the
whole state, so any survivor is a donor. Under any other layout (ZeRO-1 and
FSDP2 shards, tensor- and pipeline-parallel parts) a rank's state is its
own: after each snapshot every rank sends it to its *buddy* (the rank
``buddy_offset`` on, on another node) and keeps its own buddy's copy, so a
lost rank's state survives in its buddy's memory. Such a group is re-formed
with a new device mesh, and the model and optimizer are built anew on it in
the survivors' processes (cheap beside a new process: nothing is imported
again), then filled from the snapshots.

The trainer imports nothing of runmgr: the link is a protocol.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
import torch.distributed as dist

from trainer import host_state
from trainer.distributed import DistEnv, gather_floats
from trainer.host_state import HostState

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


def copy_part(part: Any, destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    """How a snapshot copies each part of the state (a test may stop a copy half-way here)."""
    host_state.copy_part(part, destinations, sources)


class Snapshots:
    """This rank's newest in-memory snapshots by step and, under a layout whose state is not
    replicated, its buddy's: the newest :data:`KEPT_SNAPSHOTS` of each. The oldest one's
    memory is reused for the next, so a snapshot every step allocates nothing after the
    first two."""

    def __init__(self, interval: int) -> None:
        self.interval = interval
        self._kept: dict[int, HostState] = {}
        self._buddy: dict[int, HostState] = {}

    def due(self, step: int) -> bool:
        return step % self.interval == 0

    def take(self, step: int, state: dict) -> HostState:
        """Keep a host copy of ``state`` (tensors copied) as the snapshot of ``step``."""
        recycled = self._kept.pop(min(self._kept)) if len(self._kept) >= KEPT_SNAPSHOTS else None
        self._kept[step] = host_state.take(state, recycled, copy=_copy_part)
        return self._kept[step]

    def recycle_buddy(self) -> Optional[HostState]:
        """The oldest buddy copy, given up (when all are kept) so that the next one reuses its memory:
        a copy overwritten by a transfer that breaks off half-way is no longer counted as held."""
        return self._buddy.pop(min(self._buddy)) if len(self._buddy) >= KEPT_SNAPSHOTS else None

    def keep_buddy(self, step: int, copy: HostState) -> None:
        """Keep the buddy's snapshot of ``step`` (received whole: only then is it kept)."""
        self._buddy[step] = copy
        while len(self._buddy) > KEPT_SNAPSHOTS:
            self._buddy.pop(min(self._buddy))

    @property
    def steps(self) -> list[int]:
        return sorted(self._kept)

    @property
    def buddy_steps(self) -> list[int]:
        return sorted(self._buddy)

    def own(self, step: int) -> HostState:
        return self._kept[step]

    def buddy(self, step: int) -> HostState:
        return self._buddy[step]

    def get(self, step: int) -> dict:
        """A copy of the snapshot of ``step`` (restoring must not alias what is kept)."""
        return self._kept[step].unpack()

    def keep_only(self, step: int) -> None:
        """After a rollback to ``step``: newer snapshots belong to an abandoned branch."""
        self._kept = {kept: state for kept, state in self._kept.items() if kept <= step}
        self._buddy = {kept: state for kept, state in self._buddy.items() if kept <= step}


def _copy_part(part: Any, destinations: list[torch.Tensor], sources: list[torch.Tensor]) -> None:
    copy_part(part, destinations, sources)  # looked up at each call: a test may replace it


class NoCommonSnapshot(RuntimeError):
    """The survivors hold no snapshot in common: the driver must restart cold."""


def _padded(steps: list[int]) -> list[float]:
    return ([-1.0] * KEPT_SNAPSHOTS + [float(step) for step in steps])[-KEPT_SNAPSHOTS:]


def agree_on_step(snapshots: Optional[Snapshots], donors: Mapping[int, int], world_size: int,
                  device: torch.device, at_most: Optional[int] = None, from_buddies: bool = False) -> int:
    """The newest step, at most ``at_most``, whose snapshot the re-formed group can resume from (a
    collective of the new group): every surviving rank holds its own, and each replaced rank's
    donor holds the replaced rank's: its own snapshot (a replica), or with ``from_buddies`` its
    buddy copy. ``snapshots``: None on a replacement, which holds none."""
    own = snapshots.steps if snapshots is not None else []
    buddy = snapshots.buddy_steps if snapshots is not None else []
    rows = gather_floats(_padded(own) + _padded(buddy), world_size, device)
    held = [({int(s) for s in row[:KEPT_SNAPSHOTS] if s >= 0}, {int(s) for s in row[KEPT_SNAPSHOTS:] if s >= 0})
            for row in rows]
    needed = [held[rank][0] for rank in range(world_size) if rank not in donors]
    needed += [held[donor][1] if from_buddies else held[donor][0] for donor in donors.values()]
    common = set.intersection(*needed) if needed else set()
    common = {step for step in common if at_most is None or step <= at_most}
    if not common:
        raise NoCommonSnapshot(f"the re-formed group holds no snapshot in common at or before step {at_most} "
                               f"(own {[sorted(h[0]) for h in held]}, buddy copies {[sorted(h[1]) for h in held]})")
    return max(common)
