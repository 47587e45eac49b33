"""What a rank that keeps warm state and whoever drives it agree on: where the group re-forms
(:class:`Rejoin`), how the rank reaches its driver (:class:`WarmLink`), and which ranks hold whose
snapshot (the buddies). Plain data and arithmetic: the driver reads this module without the
snapshot machinery of trainer/warm.py, whose copies of sharded state import
torch.distributed.tensor (about 1.5 s of a driver's start, for a dataclass and a function)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Protocol

from trainer.dist_env import DistEnv
from trainer.parallel.layout import Layout
from trainer.plan import ResumePlan


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

    buddy_offset: int
    """Under a layout whose state is not replicated, each rank's snapshot is also kept by the
    rank this many on (modulo the world size): the driver places the ranks, and picks an
    offset that puts every buddy on another node."""

    def rejoin(self, error: BaseException, newest_snapshot: Optional[int]) -> Optional[Rejoin]:
        """A collective failed because a peer went away: block until the driver says where the
        group re-forms. None: the driver restarts cold; the error is raised."""

    def join(self) -> Rejoin:
        """A ready spare: block until the driver names the rank it replaces."""


def snapshot_holders(rank: int, layout: Layout, buddy_offset: int = 1) -> tuple[int, ...]:
    """The ranks whose memory holds ``rank``'s snapshot, itself first: every rank in plain data
    parallel (each replica holds the whole state), else ``rank`` and its buddy, ``buddy_offset``
    ranks on (a shard of sharded state, a tensor- or pipeline-parallel part is this rank's alone)."""
    world = layout.world_size
    if layout.plain:
        return (rank, *(other for other in range(world) if other != rank))
    buddy = buddy_of(rank, layout, buddy_offset)
    return (rank,) if buddy is None else (rank, buddy)


def buddy_of(rank: int, layout: Layout, buddy_offset: int = 1) -> Optional[int]:
    """The rank that keeps a copy of ``rank``'s snapshot (None: plain data parallel, whose
    replicas need none, or a single rank)."""
    if layout.plain:
        return None
    buddy = (rank + buddy_offset) % layout.world_size
    return None if buddy == rank else buddy


def buddy_source(rank: int, layout: Layout, buddy_offset: int = 1) -> Optional[int]:
    """The rank whose snapshot ``rank`` keeps a copy of (the inverse of :func:`buddy_of`)."""
    if layout.plain:
        return None
    source = (rank - buddy_offset) % layout.world_size
    return None if source == rank else source
