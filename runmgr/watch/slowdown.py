"""Slowdown: the job's throughput well below its own baseline (OPT run 12.11).

The median of the last ``recent_window`` observations is compared with the
median of the ``baseline_window`` observations before them. The baseline is
frozen during an episode; a new sub-run starts afresh, since a restart can
change the world size and with it the throughput.
"""

from __future__ import annotations

from collections import deque
from typing import Optional

from runmgr.config.watcher import SlowdownConfig
from runmgr.watch.incidents import SLOWDOWN, Incident
from runmgr.watch.observations import StepObservation
from runmgr.watch.robust_stats import median


class SlowdownDetector:
    """Watches StepObservation.speed (tokens/s, or samples per second of step time)."""

    def __init__(self, config: SlowdownConfig) -> None:
        self.config = config
        self._recent: deque[tuple[int, float]] = deque()
        self._baseline: deque[float] = deque(maxlen=config.baseline_window)
        self._in_episode = False
        self._subrun: Optional[str] = None

    def update(self, obs: StepObservation, now: float) -> list[Incident]:
        """Feed one observation; returns a SLOWDOWN incident when an episode starts."""
        if obs.subrun != self._subrun:
            self._recent.clear()
            self._baseline.clear()
            self._in_episode = False
            self._subrun = obs.subrun
        speed = obs.speed
        if speed is None:
            return []
        self._recent.append((obs.step, speed))
        if len(self._recent) > self.config.recent_window:
            _, older = self._recent.popleft()
            if not self._in_episode:
                self._baseline.append(older)
        if len(self._baseline) < self.config.min_history or len(self._recent) < self.config.recent_window:
            return []
        base, current = median(self._baseline), median(s for _, s in self._recent)
        drop = 1.0 - current / base if base > 0 else 0.0
        if self._in_episode:
            if drop < self.config.max_drop / 2:
                self._in_episode = False
            return []
        if drop <= self.config.max_drop:
            return []
        self._in_episode = True
        return [Incident(
            kind=SLOWDOWN, time=now, subrun=obs.subrun,
            description=(f"throughput {current:.4g} over the last {len(self._recent)} observations is "
                         f"{drop:.0%} below the run's baseline {base:.4g} (threshold {self.config.max_drop:.0%})"),
            onset_step=next(step for step, s in self._recent if s < base * (1 - self.config.max_drop)),
            evidence={"baseline": base, "recent": current, "drop": drop, "max_drop": self.config.max_drop},
        )]
