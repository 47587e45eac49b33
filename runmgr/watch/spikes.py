"""Spikes of one metric (the loss, or the gradient norm) against its own past.

The baseline is the median and MAD of the last ``window`` normal values; a
value far above it (in robust sigmas *and* in relative terms) opens an
episode. The episode is reported once: as ``recovered`` when the metric came
back within ``grace_steps`` of the onset (PaLM and seed 000: such spikes are
recorded and training goes on), or as persistent at the first observation
past the grace window. Values inside an episode never enter the baseline, so
a spike cannot drag the baseline up after itself; a divergence too slow to
jump out of the band (the rolling median itself creeping up) is caught by
comparing the rolling median with its lowest value (``drift_rise``).

A new sub-run resumes from a checkpoint at step S (its first step is S+1):
the loss curve of the lineage goes on from S, so the detector goes back to
what it knew at S: the baseline and the floor as they were then, and an
episode whose onset is at or before S stays open (a worker lost in the middle
of a garbage window must not hide the spike). Whatever came after S is being
redone and is forgotten.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace
from itertools import islice
from typing import Optional

from runmgr.config.watcher import SpikeConfig
from runmgr.watch.incidents import Incident
from runmgr.watch.observations import StepObservation, onset_position
from runmgr.watch.robust_stats import is_finite, median, robust_sigma


# Baseline values kept beyond the window, so that a resume a few hundred steps back
# finds the window it had then.
HISTORY_FACTOR = 10


@dataclass(frozen=True)
class _Floor:
    """The lowest rolling median so far: seen at ``step``, with the band then and
    where its step's batch began (the onset of a drift from it)."""

    step: int
    center: float
    sigma: float
    position: tuple[int, Optional[int], Optional[int]]


@dataclass
class _Episode:
    onset_step: int
    onset_value: float
    onset_sample: Optional[int]
    samples_per_step: Optional[int]
    center: float
    sigma: float
    peak_value: float
    peak_step: int
    normal_run: int = 0
    reported: bool = False


class SpikeDetector:
    """Watches ``metric`` (a StepObservation field) and reports ``kind`` incidents."""

    def __init__(self, metric: str, kind: str, config: SpikeConfig) -> None:
        self.metric = metric
        self.kind = kind
        self.config = config
        # (step, value) of normal values; the statistics use the last ``window``.
        self._baseline: deque[tuple[int, float]] = deque(maxlen=config.window * HISTORY_FACTOR)
        self._episode: Optional[_Episode] = None
        self._previous: Optional[StepObservation] = None
        self._subrun: Optional[str] = None
        # Each new lowest rolling median, in step order: the last is the floor. Bounded as the
        # baseline is: a pretraining loss sets a new floor nearly every step, and a list of them
        # grew by a floor a step for the whole run (777,600 steps in Llama 3's 54 days).
        self._floors: deque[_Floor] = deque(maxlen=config.window * HISTORY_FACTOR)
        # The open episode (a copy) as it stood after each step, to go back to on a resume.
        self._episodes: deque[tuple[int, Optional[_Episode]]] = deque(maxlen=config.window * HISTORY_FACTOR)

    def update(self, obs: StepObservation, now: float) -> list[Incident]:
        """Feed one observation; returns the incidents it resolves (zero or one)."""
        if self._restarted(obs):
            self._resume_at(obs.step - 1)
        self._subrun = obs.subrun
        value = getattr(obs, self.metric)
        found: list[Incident] = []
        if is_finite(value):
            found = self._judge(obs, float(value), now)
        self._previous = obs
        self._episodes.append((obs.step, replace(self._episode) if self._episode else None))
        return found

    def _resume_at(self, step: int) -> None:
        """Forget what came after checkpoint ``step``: it is being redone."""
        kept = [(s, v) for s, v in self._baseline if s <= step]
        self._baseline = deque(kept, maxlen=self._baseline.maxlen)
        self._floors = deque((f for f in self._floors if f.step <= step), maxlen=self._floors.maxlen)
        while self._episodes and self._episodes[-1][0] > step:
            self._episodes.pop()
        then = self._episodes[-1][1] if self._episodes else None
        self._episode = replace(then) if then else None
        self._previous = None

    def _window(self) -> list[float]:
        """The last ``window`` normal values."""
        return [value for _, value in islice(reversed(self._baseline), self.config.window)]

    def _restarted(self, obs: StepObservation) -> bool:
        if self._previous is None:
            return False
        return obs.subrun != self._subrun or obs.step <= self._previous.step

    def _judge(self, obs: StepObservation, value: float, now: float) -> list[Incident]:
        if self._episode is None:
            return self._open_or_learn(obs, value, now)
        episode = self._episode
        if value > episode.peak_value:
            episode.peak_value, episode.peak_step = value, obs.step
        episode.normal_run = episode.normal_run + 1 if self._is_normal(value, episode) else 0
        if episode.normal_run >= self.config.recovery_points:
            self._episode = None
            self._baseline.append((obs.step, value))
            return [] if episode.reported else [self._incident(episode, obs, now, recovered=True)]
        if not episode.reported and obs.step - episode.onset_step >= self.config.grace_steps:
            episode.reported = True
            return [self._incident(episode, obs, now, recovered=False)]
        return []

    def _open_or_learn(self, obs: StepObservation, value: float, now: float) -> list[Incident]:
        if len(self._baseline) < self.config.min_history:
            self._baseline.append((obs.step, value))
            return []
        values = self._window()
        center = median(values)
        sigma = robust_sigma(values, center)
        excess = value - center
        if excess > self.config.z_threshold * sigma and excess > self.config.min_rise * abs(center):
            onset_step, onset_sample, per_step = onset_position(self._previous, obs)
            self._episode = _Episode(onset_step, value, onset_sample, per_step, center, sigma, value, obs.step)
            return []
        self._baseline.append((obs.step, value))
        return self._drift(obs, center, sigma, now)

    def _drift(self, obs: StepObservation, center: float, sigma: float, now: float) -> list[Incident]:
        """A slow divergence: the rolling median itself well above its lowest value."""
        if not self._floors or center < self._floors[-1].center:
            self._floors.append(_Floor(obs.step, center, sigma, onset_position(self._previous, obs)))
            return []
        rise = self.config.drift_rise
        lowest = self._floors[-1]
        floor, floor_sigma, (onset_step, onset_sample, per_step) = lowest.center, lowest.sigma, lowest.position
        if rise is None or center <= floor * (1 + rise):
            return []
        # Recovery is judged against the band at the floor: the current window's spread is
        # inflated by the drift itself.
        self._episode = _Episode(onset_step, center, onset_sample, per_step, floor, floor_sigma, center,
                                 obs.step, reported=True)
        description = (f"{self.metric}'s rolling median climbed to {center:.4g} by step {obs.step}, "
                       f"{center / floor - 1:+.0%} over its lowest {floor:.4g} reached at step {onset_step} "
                       f"(threshold {rise:+.0%}): a slow divergence")
        return [Incident(
            kind=self.kind, time=now, description=description, subrun=obs.subrun, onset_step=onset_step,
            peak_step=obs.step, onset_sample=onset_sample, samples_per_step=per_step,
            evidence={"metric": self.metric, "drift": True, "lowest_median": floor, "rolling_median": center,
                      "drift_rise": rise, "resolved_step": obs.step},
        )]

    def _is_normal(self, value: float, episode: _Episode) -> bool:
        limit = max(self.config.recovery_z * episode.sigma, self.config.recovery_rise * abs(episode.center))
        return value - episode.center <= limit

    def _incident(self, episode: _Episode, obs: StepObservation, now: float, recovered: bool) -> Incident:
        cfg = self.config
        rise = episode.peak_value / episode.center - 1 if episode.center else float("inf")
        z = (episode.peak_value - episode.center) / episode.sigma
        after = obs.step - episode.onset_step
        head = (f"{self.metric} rose to {episode.peak_value:.4g} at step {episode.peak_step} "
                f"({rise:+.0%} over the baseline median {episode.center:.4g}, z={z:.1f})")
        if recovered:
            tail = f"and recovered by step {obs.step}, {after} steps after onset (grace {cfg.grace_steps})"
        else:
            tail = (f"and was still {getattr(obs, self.metric):.4g} at step {obs.step}, "
                    f"{after} steps after onset (grace {cfg.grace_steps}): persistent")
        evidence = {
            "metric": self.metric,
            "baseline_median": episode.center,
            "robust_sigma": episode.sigma,
            "onset_value": episode.onset_value,
            "peak_value": episode.peak_value,
            "peak_z": z,
            "peak_rise": rise,
            "grace_steps": cfg.grace_steps,
            "resolved_step": obs.step,
        }
        return Incident(
            kind=self.kind, time=now, description=f"{head} {tail}", subrun=obs.subrun,
            onset_step=episode.onset_step, peak_step=episode.peak_step, recovered=recovered,
            onset_sample=episode.onset_sample, samples_per_step=episode.samples_per_step, evidence=evidence,
        )
