"""Whether a fault's restart can be warm, as plain data in and a verdict out.

A warm restart keeps the surviving ranks alive with their model, optimizer and
data position in memory; the lost ranks are replaced by ready spare processes
that restore from a peer's in-memory snapshot (torchft's heal from a peer,
DLRover's flash checkpoint). It costs about a second and at most the steps
since the snapshot. It is possible only when every lost rank's snapshot lives
on a node that is not lost, and a ready spare waits on a usable node for each
lost rank; otherwise today's (cold) restart from the newest verified disk
checkpoint follows, and the reason says why.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Optional


@dataclass(frozen=True)
class WarmCover:
    """What the worker group could recover warm right now (taken when a decision is due)."""

    snapshot_step: Optional[int]
    """The newest step whose in-memory snapshot every rank holds, replicated (None: none yet)."""
    rank_nodes: Mapping[int, str]
    """The node each rank of the sub-run runs on, by node name."""
    holders: Mapping[int, tuple[str, ...]]
    """The nodes whose memory holds each rank's snapshot: its own node and its peer's
    (the data-parallel replica, or a buddy for sharded state)."""
    spares: Mapping[str, int] = field(default_factory=dict)
    """Ready spare processes (torch imported, model built) by node name."""


@dataclass(frozen=True)
class WarmVerdict:
    """Warm or cold, and why, in words for the decision's reason."""

    warm: bool
    note: str
    lost_ranks: tuple[int, ...] = ()
    """The ranks a warm restart replaces (empty when cold)."""


def warm_verdict(cover: Optional[WarmCover], dead_ranks: Collection[int], lost_nodes: Collection[str],
                 avoid: Collection[str], newest_disk_step: Optional[int]) -> WarmVerdict:
    """Whether ``cover`` can replace ``dead_ranks`` and every rank on ``lost_nodes`` (the
    nodes a decision excludes) warm, with no spare or snapshot on those or on ``avoid``."""
    if cover is None or (not cover.spares and not cover.holders):
        return WarmVerdict(False, "cold: the worker group keeps no spares or memory snapshots")
    if cover.snapshot_step is None:
        return WarmVerdict(False, "cold: no memory snapshot yet")
    if newest_disk_step is not None and cover.snapshot_step < newest_disk_step:
        return WarmVerdict(False, (f"cold: the memory snapshot (step {cover.snapshot_step}) is older than the newest "
                                   f"verified checkpoint (step {newest_disk_step})"))
    gone = {*lost_nodes, *avoid}
    lost = sorted({*dead_ranks, *(rank for rank, node in cover.rank_nodes.items() if node in lost_nodes)})
    if not lost:
        return WarmVerdict(False, "cold: no lost rank is known")
    orphaned = [rank for rank in lost if not set(cover.holders.get(rank, ())) - gone]
    if orphaned:
        return WarmVerdict(False, (f"cold: the memory snapshot of rank(s) {', '.join(map(str, orphaned))} is only on "
                                   f"nodes that are lost"))
    ready = sum(count for node, count in cover.spares.items() if node not in gone)
    if ready < len(lost):
        return WarmVerdict(False, f"cold: {ready} ready spare(s) for {len(lost)} lost rank(s)")
    ranks = ", ".join(map(str, lost))
    return WarmVerdict(True, (f"warm: the survivors keep their state, rank(s) {ranks} restart on ready spares "
                              f"from a peer's memory at step {cover.snapshot_step}"), tuple(lost))


def buddy_offset(rank_nodes: Sequence[str]) -> int:
    """How many ranks on each rank's buddy sits (trainer/warm.py: the rank that keeps a copy of
    a rank's snapshot when no replica holds it): the smallest offset that puts every rank's buddy
    on another node than its own, else 1 (one node: a buddy there survives a lost process, not a
    lost node, and the verdict says so)."""
    world = len(rank_nodes)
    for offset in range(1, world):
        if all(rank_nodes[rank] != rank_nodes[(rank + offset) % world] for rank in range(world)):
            return offset
    return 1
