"""The watcher routes each observation to the detectors that read it."""

from __future__ import annotations

import pytest

from runmgr.config.watcher import WatcherConfig
from runmgr.watch.incidents import DEVICE_FAULT, HANG, WORKER_DEATH
from runmgr.watch.observations import DeviceObservation, HeartbeatObservation, WorkerExit
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
