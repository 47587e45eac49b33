"""All detectors behind one door: feed observations, get incidents.

The controller (and the offline replay) hands every observation to
:meth:`Watcher.observe` with the current time, and calls :meth:`Watcher.check`
periodically so that silence (a hang) is noticed without any observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional, Sequence, Union

from runmgr.config.watcher import WatcherConfig
from runmgr.watch.deaths import DeathDetector
from runmgr.watch.devices import DeviceDetector
from runmgr.watch.ending import EndDetector
from runmgr.watch.hang import HangDetector
from runmgr.watch.local_norms import LocalNormsMemory
from runmgr.watch.incidents import GRAD_SPIKE, LAUNCH_FAILURE, LOSS_SPIKE, Incident
from runmgr.watch.nonfinite import NonFiniteDetector, RaisedNonFiniteDetector
from runmgr.watch.observations import (
    CheckpointObservation, DeviceObservation, HeartbeatObservation, JobEnded, LaunchFailure, LoadedCheckpoint,
    LocalNormsObservation, RankTimings, RefusedValue, SaveStarted, StepObservation, UploadObservation, WorkerExit,
)
from runmgr.watch.scale import LossScaleDetector
from runmgr.watch.silences import PlannedSilences
from runmgr.watch.slowdown import SlowdownDetector
from runmgr.watch.spikes import SpikeDetector
from runmgr.watch.storage import StorageOutageDetector
from runmgr.watch.stragglers import StragglerDetector

Observation = Union[StepObservation, HeartbeatObservation, DeviceObservation, WorkerExit, CheckpointObservation,
                    LaunchFailure, UploadObservation, RankTimings, SaveStarted, LoadedCheckpoint,
                    LocalNormsObservation, PlannedSilences, JobEnded, RefusedValue]


class Watcher:
    """Routes each observation to the detectors that read it."""

    def __init__(self, config: WatcherConfig, rank_nodes: Optional[Mapping[int, str]] = None) -> None:
        self.config = config
        # The spike detectors follow the lineage's curves across sub-runs; the
        # others describe one sub-run's ranks and start afresh with it.
        self.spikes = (
            SpikeDetector("loss", LOSS_SPIKE, config.loss_spike),
            SpikeDetector("grad_norm", GRAD_SPIKE, config.grad_spike),
        )
        self.stragglers = StragglerDetector(config.straggler, rank_nodes)
        self.subrun_detectors = (
            NonFiniteDetector(),
            LossScaleDetector(config.loss_scale),
            self.stragglers,
            SlowdownDetector(config.slowdown),
        )
        self.hang = HangDetector(config.hang)
        self.devices = DeviceDetector(config.devices)
        self.deaths = DeathDetector(config.devices.fatal_event_codes)
        self.raised_nonfinite = RaisedNonFiniteDetector()
        self.storage = StorageOutageDetector(config.storage)
        self.local_norms = LocalNormsMemory()
        self.ending = EndDetector()

    def for_new_subrun(self, rank_nodes: Optional[Mapping[int, str]] = None) -> "Watcher":
        """A watcher for the ranks of a new sub-run: the per-rank and per-sub-run
        detectors start afresh; the device detector keeps its memory, so a
        device that stays faulty is reported once, not once per sub-run; the
        spike detectors keep the lineage's curve up to the resume step; an S3
        outage outlives sub-runs (the driver's uploads go on across them); the local
        norms are the lineage's, up to the resume step; the hang watch keeps the phase
        durations it measured (the same job's iteration and save times)."""
        fresh = Watcher(self.config, rank_nodes)
        fresh.hang = self.hang.for_new_subrun()
        fresh.devices = self.devices
        fresh.storage = self.storage
        fresh.spikes = self.spikes
        fresh.local_norms = self.local_norms
        return fresh

    def observe_all(self, observations: Sequence[Observation], now: float) -> list[Incident]:
        """Feed observations seen together (one poll's): the heartbeats are taken as they come
        and the ranks checked for silence once, after the others' incidents."""
        incidents: list[Incident] = []
        beats = False
        for obs in observations:
            if isinstance(obs, HeartbeatObservation):
                self.hang.take(obs)
                beats = True
            else:
                incidents += self.observe(obs, now)
        return incidents + (self.hang.check(now) if beats else [])

    def observe(self, obs: Observation, now: float) -> list[Incident]:
        """Feed one observation; returns the incidents it produced (usually none)."""
        if isinstance(obs, StepObservation):
            self.raised_nonfinite.note_step(obs)
            self.local_norms.note(obs.subrun, obs.step)
            detectors = self.spikes + self.subrun_detectors
            return [incident for detector in detectors for incident in detector.update(obs, now)]
        if isinstance(obs, LocalNormsObservation):
            self.local_norms.update(obs)
            return []
        if isinstance(obs, HeartbeatObservation):
            return self.hang.update(obs, now)
        if isinstance(obs, DeviceObservation):
            return self.devices.update(obs, now)
        if isinstance(obs, WorkerExit):
            raised = self.raised_nonfinite.update(obs, now)  # a divergence, for the ladder, not a death
            return raised if raised is not None else self.deaths.update(obs, now)
        if isinstance(obs, UploadObservation):
            return self.storage.update(obs, now)
        if isinstance(obs, RankTimings):
            return self.stragglers.update(obs, now)
        if isinstance(obs, (CheckpointObservation, SaveStarted, LoadedCheckpoint)):
            return []  # checkpoints inform the policy (where to restart), not the detectors
        if isinstance(obs, RefusedValue):
            return []  # what the job printed and cannot be feeds no detector (the logbook records it)
        if isinstance(obs, PlannedSilences):
            self.hang.expect(obs)
            return []
        if isinstance(obs, JobEnded):
            return self.ending.update(obs, now)
        if isinstance(obs, LaunchFailure):
            what = "the warm restart failed" if obs.warm else "the workers could not be started"
            return [Incident(LAUNCH_FAILURE, now, f"{what}: {obs.text}", subrun=obs.subrun,
                             evidence={"error": obs.text, **({"warm": True} if obs.warm else {})})]
        raise TypeError(f"not an observation: {type(obs).__name__}")

    def check(self, now: float) -> list[Incident]:
        """Incidents that time alone produces (hangs, an S3 outage), as of ``now``."""
        return self.hang.check(now) + self.storage.check(now)

    def next_silence_at(self) -> Optional[float]:
        """When a silence would first be reported if nothing were heard before (the hang
        detector's; None: never)."""
        return self.hang.next_report_at()
