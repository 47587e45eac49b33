"""Several decisions in one poll that each end the sub-run (a spike and an ECC error
seen together): what they amount to, decided here rather than by the executor. The
first abort wins (else the first decision); nothing the others ask is lost: stacks are
dumped if any asks, every node any of them excludes stays out, the smallest data-parallel
size any of them asks for is used; a warm decision is carried out warm only alone (it
covers its own incident's ranks, not the others')."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

from runmgr.policy.decision import ABORT, Decision


@dataclass(frozen=True)
class Ending:
    """How the sub-run ends."""

    chosen: int
    """Index of the decision carried out (its incident is the sub-run's cause of ending)."""
    dump_stacks: bool
    """Dump every rank's stacks before stopping them."""
    stop_group: bool
    """Stop every rank (False: a lone warm decision keeps the survivors)."""
    also_exclude: tuple[str, ...]
    """Every node any of the decisions excludes."""
    also_resize: Optional[int]
    """The smallest data-parallel size any of them asks for (None: none asks)."""


def merge_ending(decisions: Sequence[Decision]) -> Ending:
    """What ``decisions`` (each ending the sub-run, in the order judged) amount to."""
    chosen = next((i for i, d in enumerate(decisions) if d.action == ABORT), 0)
    sizes = [d.data_parallel_size for d in decisions if d.data_parallel_size is not None]
    return Ending(
        chosen=chosen,
        dump_stacks=any(d.dump_stacks for d in decisions),
        stop_group=not (decisions[chosen].warm and len(decisions) == 1),
        also_exclude=tuple(dict.fromkeys(node for d in decisions for node in d.exclude_nodes)),
        also_resize=min(sizes, default=None),
    )
