"""Which step's state each rank of a warm group holds in memory: the snapshot bookkeeping
that the per-rank warm group and a node's agent share.

A rank says it in its beats: a beat of phase ``snapshot`` at the step it copied, or, in plain
data parallel where a replica's live state serves (trainer/live.py), a beat of phase ``step``
as it begins a step (it holds the state committed at the step before). The per-rank group
reads every rank's beats; an agent folds its node's beats into one, so it keeps a ledger of
its own and sends the group a :class:`HeldSnapshot` only when a rank's held step changed (once
per memory interval, not per beat), which the group's ledger takes.

Ray-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from trainer.report import Heartbeat

HELD = "held"
"""The report kind of a :class:`HeldSnapshot`, in an agent's node report."""


@dataclass(frozen=True)
class HeldSnapshot:
    """``rank`` holds in memory the state of ``step``."""

    rank: int
    step: int


def held_step(beat: Heartbeat, live: bool) -> Optional[int]:
    """The step whose state ``beat`` says its rank holds: a snapshot's, or under ``live`` (plain
    data parallel) the step before the one it begins; None when the beat says nothing of it."""
    if beat.phase == "snapshot":
        return beat.step
    if beat.phase == "step" and live:
        return beat.step - 1
    return None


class SnapshotLedger:
    """The newest step each rank holds in memory, as its beats (or its agent) said."""

    def __init__(self, live: bool = False) -> None:
        """``live``: plain data parallel, where a replica's live state serves."""
        self.live = live
        self._held: dict[int, int] = {}

    def beat(self, beat: Heartbeat) -> Optional[HeldSnapshot]:
        """Take ``beat``; what its rank holds now when that changed (None otherwise)."""
        step = held_step(beat, self.live)
        return None if step is None else self.hold(HeldSnapshot(beat.rank, step))

    def hold(self, held: HeldSnapshot) -> Optional[HeldSnapshot]:
        """``held.rank`` holds ``held.step`` (an older step than known is ignored); ``held`` when
        it is news."""
        if held.step <= self._held.get(held.rank, -1):
            return None
        self._held[held.rank] = held.step
        return held

    def committed(self, step: int) -> None:
        """Rank 0 reported ``step`` committed: under ``live`` it holds that step's state."""
        if self.live:
            self.hold(HeldSnapshot(0, step))

    def step_of(self, rank: int) -> Optional[int]:
        return self._held.get(rank)

    def clear(self) -> None:
        """The group re-formed: what was held belongs to the old one."""
        self._held = {}
