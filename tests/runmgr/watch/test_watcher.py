"""The watcher routes each observation to the detectors that read it."""

from __future__ import annotations

import pytest

from runmgr.config.watcher import WatcherConfig
from runmgr.watch.incidents import DEVICE_FAULT, HANG, STRAGGLER, WORKER_DEATH
from runmgr.watch.observations import (
    DeviceObservation, HeartbeatObservation, LoadedCheckpoint, RankTimings, SaveStarted, WorkerExit,
)
from runmgr.watch.watcher import Watcher


def test_heartbeats_devices_and_exits_reach_their_detectors():
    watcher = Watcher(WatcherConfig())
    assert watcher.observe(HeartbeatObservation(0, "step", 1, 0.0, "node-0"), 0.0) == []
    assert [i.kind for i in watcher.check(601.0)] == [HANG]
    fault = watcher.observe(DeviceObservation("node-1", 2, "ecc", 5.0, uncorrectable=3), 5.0)
    death = watcher.observe(WorkerExit(1, "node-1", "RuntimeError: CUDA error: unknown error", 6.0), 6.0)
    assert [i.kind for i in fault + death] == [DEVICE_FAULT, WORKER_DEATH]


def test_anything_else_is_refused():
    with pytest.raises(TypeError, match="not an observation"):
        Watcher(WatcherConfig()).observe("loss went up", 0.0)


def test_megatrons_rank_timings_reach_the_straggler_detector_and_save_lines_nothing():
    watcher = Watcher(WatcherConfig(), {0: "node-0", 5: "node-1"})
    assert watcher.observe(SaveStarted(10, 1.0, "1.00"), 1.0) == []
    assert watcher.observe(LoadedCheckpoint(10, "/ckpt", 1.0, "1.00"), 1.0) == []
    found = [incident for i in range(1, 31)
             for incident in watcher.observe(RankTimings(10 * i, float(i), "1.00", {0: 1.0, 5: 1.6}), float(i))]
    assert [(i.kind, i.ranks, i.nodes) for i in found] == [(STRAGGLER, (5,), ("node-1",))]
