"""Stragglers: a rank whose compute time is persistently above its peers'.

In a synchronous data-parallel step every rank waits for the slowest, so one
slow device or node slows the whole job (seed 000: find slow machines by
comparing them with the fleet, then exclude them). Each step, a rank's
forward+backward time is divided by the median of the *other* ranks; a rank
slow in at least ``min_share`` of the last ``window`` steps is a straggler.
Reported once per episode; the episode ends when the share halves.

Partial timings (Megatron's straggler report names only the fastest and the
slowest rank) compare only the ranks they name; a rank known from an earlier
report and absent from this one was not the slowest, so it counts as not slow.
A rank that is the slowest report after report, above ``ratio`` x the fastest,
is a straggler.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Optional

from runmgr.config.watcher import StragglerConfig
from runmgr.watch.incidents import STRAGGLER, Incident
from runmgr.watch.observations import RankTimings, StepObservation
from runmgr.watch.robust_stats import median, medians_without_each


class StragglerDetector:
    """Watches StepObservation.compute_times (index = rank) and RankTimings (some ranks)."""

    def __init__(self, config: StragglerConfig, rank_nodes: Optional[Mapping[int, str]] = None) -> None:
        self.config = config
        self.rank_nodes = dict(rank_nodes or {})
        self._ratios: dict[int, deque[tuple[int, float]]] = {}
        self._flagged: set[int] = set()
        self._subrun: Optional[str] = None

    def update(self, obs: StepObservation | RankTimings, now: float) -> list[Incident]:
        """Feed one observation; returns an incident naming newly persistent stragglers."""
        if obs.subrun != self._subrun:
            self._ratios.clear()  # the world (and its placement) may have changed
            self._flagged.clear()
            self._subrun = obs.subrun
        if isinstance(obs, RankTimings):
            times = dict(obs.seconds)
            absent = [rank for rank in self._ratios if rank not in times]
        else:
            times, absent = dict(enumerate(obs.compute_times)), []
        if len(times) < 2:
            return []
        ranks, seconds = list(times), list(times.values())
        for rank, own, peers in zip(ranks, seconds, medians_without_each(seconds)):
            self._record(rank, obs.step, own / peers if peers > 0 else 1.0)
        for rank in absent:
            self._record(rank, obs.step, 1.0)
        return self._judge(obs.subrun, now, world=len(self._ratios))

    def _record(self, rank: int, step: int, ratio: float) -> None:
        self._ratios.setdefault(rank, deque(maxlen=self.config.window)).append((step, ratio))

    def _share_slow(self, rank: int) -> float:
        ratios = self._ratios[rank]
        return sum(r > self.config.ratio for _, r in ratios) / len(ratios)

    def _onset(self, rank: int) -> int:
        """The step the slowness began: the start of the window's suffix with the most
        slow-minus-normal steps (earliest on a tie). A lone noisy step before the
        slowdown scores less than the clean suffix after it, so it is not the onset."""
        best_score, best_step, score = 0, None, 0
        for step, ratio in reversed(self._ratios[rank]):
            score += 1 if ratio > self.config.ratio else -1
            if score >= best_score:
                best_score, best_step = score, step
        return best_step if best_step is not None else self._ratios[rank][-1][0]

    def _judge(self, subrun: str, now: float, world: int) -> list[Incident]:
        new = []
        for rank, ratios in sorted(self._ratios.items()):
            if len(ratios) < self.config.window:
                continue
            share = self._share_slow(rank)
            if rank in self._flagged and share < self.config.min_share / 2:
                self._flagged.discard(rank)
            elif rank not in self._flagged and share >= self.config.min_share:
                self._flagged.add(rank)
                new.append(rank)
        if not new:
            return []
        details = {rank: {"median_ratio": median(r for _, r in self._ratios[rank]),
                          "share_slow": self._share_slow(rank),
                          "node": self.rank_nodes.get(rank, "")} for rank in new}
        worst = max(new, key=lambda r: details[r]["median_ratio"])
        description = (f"rank {worst}" + (f" on {details[worst]['node']}" if details[worst]["node"] else "")
                       + f" took {details[worst]['median_ratio']:.2f}x its peers' median compute time, slow in "
                       f"{details[worst]['share_slow']:.0%} of the last {self.config.window} steps "
                       f"(threshold {self.config.ratio:.2f}x in {self.config.min_share:.0%})")
        if len(new) > 1:
            description += f"; {len(new) - 1} more rank(s) slow"
        return [Incident(
            kind=STRAGGLER, time=now, subrun=subrun, description=description,
            onset_step=min(self._onset(rank) for rank in new),
            ranks=tuple(new),
            nodes=tuple(sorted({d["node"] for d in details.values() if d["node"]})),
            evidence={"ranks": {str(r): d for r, d in details.items()}, "world_size": world},
        )]
