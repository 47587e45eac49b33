"""Who does what: the (pipeline, data, tensor) coordinates of every rank.

Ranks are numbered tensor-parallel fastest, then data parallel, then
pipeline (Megatron's default order): the ranks of one tensor-parallel group
are neighbours, so on a real cluster they share a node and its fast links.
Pure: no process group is touched here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Sharding(str, Enum):
    """How data-parallel ranks hold the optimizer state and weights."""

    none = "none"
    """Replicated weights, gradients and optimizer state (plain data parallel)."""
    zero1 = "zero1"
    """The distributed optimizer: optimizer state (and the fp32 update) sharded over data parallel."""
    fsdp2 = "fsdp2"
    """``fully_shard``: weights, gradients and optimizer state sharded over data parallel."""


@dataclass(frozen=True)
class Coords:
    """One rank's place in the layout."""

    pp: int
    """Pipeline stage."""
    dp: int
    """Data-parallel replica: which slice of the global batch it trains on."""
    tp: int
    """Tensor-parallel rank within its group."""


@dataclass(frozen=True)
class Layout:
    """The split of ``world_size = pp x dp x tp`` ranks."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    sharding: Sharding = Sharding.none

    @property
    def world_size(self) -> int:
        return self.dp * self.tp * self.pp

    @property
    def plain(self) -> bool:
        """Plain data parallel: every rank holds the whole model and optimizer."""
        return self.tp == 1 and self.pp == 1 and self.sharding == Sharding.none

    def coords(self, rank: int) -> Coords:
        """Where ``rank`` sits (tensor parallel fastest, pipeline slowest)."""
        return Coords(pp=rank // (self.dp * self.tp), dp=(rank // self.tp) % self.dp, tp=rank % self.tp)

    def holds_loss(self, rank: int) -> bool:
        """Whether ``rank`` computes the loss: the last pipeline stage does."""
        return self.coords(rank).pp == self.pp - 1

    def seed_rank(self, rank: int) -> int:
        """The rank whose random stream ``rank`` draws from each step: the first
        of its tensor-parallel group (itself when tp is 1), so that the ranks
        of a group draw the same dropout masks on their replicated activations."""
        return rank - self.coords(rank).tp

    def describe(self) -> str:
        """``dp 2 x tp 2 x pp 1, zero1``: as logs and reports print it."""
        text = f"dp {self.dp} x tp {self.tp} x pp {self.pp}"
        return text if self.sharding == Sharding.none else f"{text}, {self.sharding.value}"


def layout_of(world_size: int, tp: int = 1, pp: int = 1, zero1: bool = False, fsdp2: bool = False) -> Layout:
    """The layout of ``world_size`` ranks at tensor parallel ``tp`` and
    pipeline parallel ``pp`` (the rest is data parallel); the caller has
    checked that ``tp x pp`` divides the world size."""
    sharding = Sharding.fsdp2 if fsdp2 else Sharding.zero1 if zero1 else Sharding.none
    return Layout(dp=world_size // (tp * pp), tp=tp, pp=pp, sharding=sharding)
