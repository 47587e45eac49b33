"""A node agent sums its ranks up into one report per interval (:class:`NodeSummariser`).

Per rank the agent hears everything (every beat, every report, every exit), and keeps what an
incident may ask for; per node it tells the driver only what the driver's detectors need:

- **one heartbeat per node**, the laggard's: a hang is a rank that stops beating, and then the
  node's oldest last beat stops moving, so the driver's hang detector watches nodes and still
  names the rank (:attr:`runmgr.watch.observations.HeartbeatObservation.for_node`);
- **compute times per node**: rank 0's step report carries every rank's compute time; its
  node's agent replaces them with the slowest rank of each node
  (:class:`runmgr.watch.observations.RankTimings`), which the straggler detector reads as it
  reads Megatron's partial timings (a rank not named was not its node's slowest);
- **every rank's end**, at once;
- **a rank's beat into or out of a pause** (chaos's ``pause_at_step``), once per change, as a
  ``pause`` item: the run's status and chaos tell paused ranks by them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Optional

from runmgr.agents.report import NodeReport, RankEnd
from runmgr.agents.snapshots import HELD, SnapshotLedger
from runmgr.watch.observations import RankTimings
from trainer.report import PAUSED, Heartbeat, StepReport


def slowest_per_node(compute_times: Sequence[float], rank_nodes: Mapping[int, str]) -> dict[int, float]:
    """The slowest rank of each node and its time (index of ``compute_times`` = rank; a rank
    with no node in ``rank_nodes`` counts as a node of its own)."""
    slowest: dict[str, tuple[float, int]] = {}
    for rank, seconds in enumerate(compute_times):
        node = rank_nodes.get(rank, f"rank{rank}")
        if node not in slowest or seconds > slowest[node][0]:
            slowest[node] = (seconds, rank)
    return {rank: seconds for seconds, rank in slowest.values()}


class NodeSummariser:
    """The reports of one node's ranks in, one :class:`NodeReport` per interval out."""

    def __init__(self, node: str, subrun: str, ranks: Iterable[int],
                 rank_nodes: Optional[Mapping[int, str]] = None, ledger: Optional[SnapshotLedger] = None) -> None:
        """``ranks``: the node's; ``rank_nodes``: every rank's node, for rank 0's step reports
        (None on a node without rank 0: its ranks send no step report); ``ledger``: under warm
        recovery, what each rank holds in memory, sent as ``held`` items when it changes."""
        self.node = node
        self.subrun = subrun
        self.running: set[int] = set(ranks)
        self.rank_nodes = dict(rank_nodes or {})
        self._last: dict[int, Heartbeat] = {}
        self._sent_beat: Optional[Heartbeat] = None
        self._items: list[tuple[str, object]] = []
        self._ended: list[RankEnd] = []
        self.ledger = ledger

    def add(self, kind: str, item: object) -> None:
        """An item of the node's own for the next report (a spare's news)."""
        self._items.append((kind, item))

    def adopt(self, rank: int) -> None:
        """A spare of the node was named ``rank`` (a warm recovery): its beats count now."""
        self.running.add(rank)

    def take(self, rank: int, items: Iterable[tuple[str, object]]) -> None:
        """What ``rank`` said (as its drain gives it: ``(kind, report)``)."""
        for kind, item in items:
            if kind == "heartbeat" and self.ledger is not None:
                held = self.ledger.beat(item)
                if held is not None:  # news only: once per memory interval, not per beat
                    self._items.append((HELD, held))
            if kind == "heartbeat":
                previous = self._last.get(rank)
                if (item.phase == PAUSED) != (previous is not None and previous.phase == PAUSED):
                    self._items.append(("pause", item))
                self._last[rank] = item  # a rank's beats come in order: the last is its newest
            elif kind == "step":
                self._items += self._step(item)
            else:
                self._items.append((kind, item))

    def end(self, rank_end: RankEnd) -> None:
        """A rank of the node ended; its beats no longer count."""
        self.running.discard(rank_end.rank)
        self._last.pop(rank_end.rank, None)
        self._ended.append(rank_end)

    @property
    def done(self) -> bool:
        """Every rank of the node ended."""
        return not self.running

    @property
    def has_news(self) -> bool:
        """Something besides a beat waits: a step, a checkpoint, a pause, a rank's end."""
        return bool(self._items or self._ended)

    @property
    def has_beat(self) -> bool:
        """The laggard's beat changed since the last report."""
        beat = self._laggard()
        return beat is not None and beat != self._sent_beat

    def report(self, now: float) -> Optional[NodeReport]:
        """What is new since the last report; None when nothing is."""
        beat = self._laggard()
        if beat == self._sent_beat:
            beat = None
        if beat is None and not self._items and not self._ended:
            return None
        if beat is not None:
            self._sent_beat = beat
        out = NodeReport(self.node, self.subrun, now, tuple(self._items), beat, tuple(self._ended))
        self._items, self._ended = [], []
        return out

    def _laggard(self) -> Optional[Heartbeat]:
        """The last beat of the running rank that beat least recently (the lowest rank on a tie).
        A rank not heard from yet is not watched, as a rank's own beats are not before its first."""
        if not self._last:
            return None
        return min(self._last.values(), key=lambda b: (b.time, b.rank))

    def _step(self, report: StepReport) -> list[tuple[str, object]]:
        if not report.compute_times:
            return [("step", report)]
        timings = RankTimings(report.step, report.time, report.subrun,
                              slowest_per_node(report.compute_times, self.rank_nodes))
        return [("step", replace(report, compute_times=())), ("timings", timings)]
