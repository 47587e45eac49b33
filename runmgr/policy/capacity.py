"""What the cluster can hold, as plain data, and the data-parallel size that fits.

The executor takes a :class:`Capacity` snapshot when a decision is due (Ray's
alive nodes and what each can hold); the policy reads it to decide a resize
like any other remedy. Nothing here asks the cluster anything.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Optional


@dataclass(frozen=True)
class Capacity:
    """The ranks each usable node can hold, and the world sizes the run allows."""

    slots_by_node: Mapping[str, int]
    """Alive nodes the run may use (admitted by the health check), by node name, with
    how many ranks of the run's size each can hold."""
    data_parallel_sizes: tuple[int, ...]
    """Data-parallel sizes the trainer can run (the global batch divides by
    micro batch x size), at most the configured one."""
    current: int
    """Data-parallel size of the sub-run the decision ends."""
    ranks_per_replica: int = 1
    """Ranks of one data-parallel replica (tensor x pipeline parallel): a lost node takes
    whole replicas away, and a sub-run needs at least one."""
    replacement_wait_s: Optional[float] = None
    """The cluster replaces an excluded node (KubeRay starts a new pod in place of the one on
    it) within about this many seconds; None: an excluded node is gone for the lineage."""

    def slots(self, avoid: Collection[str]) -> int:
        """Ranks the nodes outside ``avoid`` can hold."""
        return sum(count for node, count in self.slots_by_node.items() if node not in avoid)

    def with_replacements(self, replaced: Collection[str]) -> "Capacity":
        """The capacity once a new node stands in for each of ``replaced`` (holding what it held)."""
        extra = {f"replacement of {node}": self.slots_by_node[node] for node in replaced
                 if node in self.slots_by_node}
        return replace(self, slots_by_node={**self.slots_by_node, **extra})


@dataclass(frozen=True)
class Resize:
    """The data-parallel size the next sub-run gets, and why (empty when unchanged)."""

    size: Optional[int]
    """None: no size the trainer can run fits on the nodes left."""
    note: str = ""


def fit_world(capacity: Capacity, avoid: Collection[str]) -> Resize:
    """The largest allowed data-parallel size whose replicas the nodes outside ``avoid``
    can hold (each replica ``capacity.ranks_per_replica`` ranks)."""
    slots, per_replica = capacity.slots(avoid), capacity.ranks_per_replica
    replicas = slots // per_replica
    held = f"{slots} rank(s)" if per_replica == 1 else f"{slots} rank(s), {replicas} replica(s) of {per_replica}"
    if replicas < 1:
        return Resize(None, (f"the nodes left hold {slots} rank(s), fewer than one data-parallel replica "
                             f"(tensor x pipeline parallel = {per_replica} ranks)"))
    fitting = [size for size in capacity.data_parallel_sizes if size <= replicas]
    if not fitting:
        return Resize(None, (f"the nodes left hold {held} and the trainer needs data parallel "
                             f"{' or '.join(map(str, sorted(capacity.data_parallel_sizes)))} (the global batch "
                             f"must divide by micro batch x data parallel)"))
    size = max(fitting)
    if size == capacity.current:
        return Resize(size)
    change = "shrinks" if size < capacity.current else "grows"
    return Resize(size, (f"data parallel {change} {capacity.current} -> {size}: the nodes left hold {held} "
                         f"(the global batch is kept by gradient accumulation)"))


UNBOUNDED_SLOTS = 1 << 20
"""What a node holds of ranks that reserve nothing (cpus_per_worker=0, no devices)."""


def slots_of(nodes: Mapping[str, Mapping[str, float]], bundle: Mapping[str, float]) -> dict[str, int]:
    """Ranks of ``bundle`` (resource -> amount per rank) each node's resources hold."""
    needs = {key: amount for key, amount in bundle.items() if amount > 0}
    return {name: int(min((resources.get(key, 0.0) // amount for key, amount in needs.items()),
                          default=UNBOUNDED_SLOTS))
            for name, resources in nodes.items()}
