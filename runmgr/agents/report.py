"""What a node's agent pushes to the driver: one :class:`NodeReport` per interval.

Plain data (the driver reads it through :class:`runmgr.workers.inbox.ReportInbox`). Rank 0's
reports pass through as they are; everything per rank is summed up per node: one heartbeat
(the node's laggard's), the end of each rank that ended, and, on rank 0's node, each step's
compute times as the slowest rank of every node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from runmgr.watch.observations import DeviceObservation
from trainer.report import Heartbeat

RankEndKind = Literal["finished", "died", "error"]


@dataclass(frozen=True)
class RankEnd:
    """A rank of the node ended: ``finished`` (exit 0), ``died`` (its process is gone) or
    ``error`` (it raised; ``text`` is the end of its traceback)."""

    rank: int
    kind: RankEndKind
    text: str
    time: float
    exit_code: Optional[int] = None
    pid: Optional[int] = None
    """The process that ended (None where unknown): after a warm recovery a killed rank's end
    may come after a spare took its rank, and the group tells the two apart by pid."""


SpareNewsKind = Literal["ready", "lost"]


@dataclass(frozen=True)
class SpareNews:
    """A warm spare forked by a node's agent is ``ready`` (built, waiting to be named) or
    ``lost`` (its process ended before it was named); an item of kind ``spare``."""

    node: str
    key: int
    """The spare's key on its node (negative: runmgr/agents/rank_processes.py ``spare_key``)."""
    kind: SpareNewsKind
    pid: int
    text: str = ""
    """Why a lost spare ended."""
    node_id: str = ""
    address: str = ""


@dataclass(frozen=True)
class NodeReport:
    """What one node's agent has to say since its last report."""

    node: str
    subrun: str
    sent: float
    """When the agent made the report (its clock)."""
    items: tuple[tuple[str, object], ...] = ()
    """Its ranks' reports as ``(kind, report)``, as a rank's drain gives them (``started``,
    ``step``, ``checkpoint``, ``local_norms``, ``waiting``), plus ``timings``
    (:class:`runmgr.watch.observations.RankTimings`) in place of each step's per-rank compute
    times, and ``pause``: a rank's beat into or out of a pause (once per change); no other
    heartbeats: those are :attr:`beat`. Under warm recovery also ``held`` (a rank's newest
    snapshot step, runmgr/agents/snapshots.py) and ``spare`` (:class:`SpareNews`)."""
    beat: Optional[Heartbeat] = None
    """The last beat of the node's laggard (its running rank that beat least recently), when it
    changed since the last report; it stands for every rank of the node."""
    ended: tuple[RankEnd, ...] = ()
    devices: tuple[DeviceObservation, ...] = ()
    """The node's device readings since the last report (its agent reads the node's device tools
    itself: runmgr/workers/devicepoll.py's poll, folded into the agent)."""

    @property
    def urgent(self) -> bool:
        """A rank ended: the driver should hear at once."""
        return bool(self.ended)
