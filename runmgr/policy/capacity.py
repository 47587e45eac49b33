"""What the cluster can hold, as plain data, and the data-parallel size that fits.

The executor takes a :class:`Capacity` snapshot when a decision is due (Ray's
alive nodes and what each can hold); the policy reads it to decide a resize
like any other remedy. Nothing here asks the cluster anything.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Capacity:
    """The ranks each usable node can hold, and the world sizes the run allows."""

    slots_by_node: Mapping[str, int]
    """Alive nodes the run may use (admitted by the health check), by node name, with
    how many ranks of the run's size each can hold."""
    world_sizes: tuple[int, ...]
    """Data-parallel sizes the trainer can run (the global batch divides by
    micro batch x size), at most the configured one."""
    current: int
    """Data-parallel size of the sub-run the decision ends."""

    def slots(self, avoid: Collection[str]) -> int:
        """Ranks the nodes outside ``avoid`` can hold."""
        return sum(count for node, count in self.slots_by_node.items() if node not in avoid)


@dataclass(frozen=True)
class Resize:
    """The data-parallel size the next sub-run gets, and why (empty when unchanged)."""

    size: Optional[int]
    """None: no size the trainer can run fits on the nodes left."""
    note: str = ""


def fit_world(capacity: Capacity, avoid: Collection[str]) -> Resize:
    """The largest allowed data-parallel size the nodes outside ``avoid`` can hold."""
    slots = capacity.slots(avoid)
    fitting = [size for size in capacity.world_sizes if size <= slots]
    if not fitting:
        return Resize(None, (f"the nodes left hold {slots} rank(s) and the trainer needs one of "
                             f"{', '.join(map(str, sorted(capacity.world_sizes)))}"))
    size = max(fitting)
    if size == capacity.current:
        return Resize(size)
    change = "shrinks" if size < capacity.current else "grows"
    return Resize(size, (f"data parallel {change} {capacity.current} -> {size}: the nodes left hold {slots} rank(s) "
                         f"(the global batch is kept by gradient accumulation)"))


UNBOUNDED_SLOTS = 1 << 20
"""What a node holds of ranks that reserve nothing (cpus_per_worker=0, no devices)."""


def slots_of(nodes: Mapping[str, Mapping[str, float]], bundle: Mapping[str, float]) -> dict[str, int]:
    """Ranks of ``bundle`` (resource -> amount per rank) each node's resources hold."""
    needs = {key: amount for key, amount in bundle.items() if amount > 0}
    return {name: int(min((resources.get(key, 0.0) // amount for key, amount in needs.items()),
                          default=UNBOUNDED_SLOTS))
            for name, resources in nodes.items()}
