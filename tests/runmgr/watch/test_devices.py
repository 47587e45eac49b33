"""Device faults from health-poll readings."""

from __future__ import annotations

import pytest

from runmgr.config.watcher import DeviceConfig
from runmgr.watch.devices import DeviceDetector
from runmgr.watch.incidents import DEVICE_FAULT
from runmgr.watch.observations import DeviceObservation


def ecc(t, correctable=0, uncorrectable=0, node="node-3", device=5):
    return DeviceObservation(node, device, "ecc", t, correctable=correctable, uncorrectable=uncorrectable)


def reasons(incidents):
    return [i.evidence["reason"] for i in incidents]


def test_one_uncorrectable_ecc_error_takes_the_device_out_naming_the_node():
    found = DeviceDetector(DeviceConfig()).update(ecc(0.0, uncorrectable=1), 0.0)
    assert [(i.kind, i.nodes) for i in found] == [(DEVICE_FAULT, ("node-3",))]
    assert found[0].evidence["device"] == 5 and "1 uncorrectable" in found[0].description


@pytest.mark.parametrize("status,faulty", [("OK", False), ("Warning", False), ("Alarm", True), ("Critical", True)])
def test_npu_health_alarm_and_critical_are_faults(status, faulty):
    reading = DeviceObservation("node-1", 0, "health", 0.0, status=status)
    assert bool(DeviceDetector(DeviceConfig()).update(reading, 0.0)) is faulty


def test_fast_rising_correctable_errors_are_a_fault_slow_ones_are_not():
    detector = DeviceDetector(DeviceConfig(correctable_rise=1000, rise_window_s=3600.0))
    slow = [detector.update(ecc(t * 3600.0, correctable=t * 900), t * 3600.0) for t in range(5)]
    assert all(found == [] for found in slow)  # 900 an hour stays under 1000 an hour
    fast = DeviceDetector(DeviceConfig(correctable_rise=1000, rise_window_s=3600.0))
    fast.update(ecc(0.0, correctable=100), 0.0)
    found = fast.update(ecc(600.0, correctable=1300), 600.0)
    assert reasons(found) == ["correctable_ecc_rising"] and "rose by 1200 in 600 s" in found[0].description


def test_each_reason_is_reported_once_until_the_counters_reset():
    detector = DeviceDetector(DeviceConfig())
    assert len(detector.update(ecc(0.0, uncorrectable=1), 0.0)) == 1
    assert detector.update(ecc(60.0, uncorrectable=2), 60.0) == []
    detector.update(ecc(120.0, correctable=0, uncorrectable=0), 120.0)  # driver reloaded
    assert len(detector.update(ecc(180.0, uncorrectable=1), 180.0)) == 1


def test_a_node_read_by_its_poller_and_its_agent_at_a_handover_makes_one_incident_of_one_fault():
    # A sub-run's agent now holds a node a poller read (runmgr/workers/devicepoll.py cover): for a
    # moment both read it, and their readings come by two paths (the agent's report, the poller's
    # collector), not in the order they were taken.
    detector = DeviceDetector(DeviceConfig())
    agents_first = detector.update(ecc(10.0, uncorrectable=2), 10.5)  # the fault, read by the agent
    pollers_last = detector.update(ecc(9.0), 10.5)  # taken before it: no fault yet
    pollers_fault = detector.update(ecc(10.2, uncorrectable=2), 10.5)  # both read the fault
    agents_next = detector.update(ecc(12.0, uncorrectable=2), 12.5)
    assert len(agents_first) == 1
    assert pollers_last == pollers_fault == agents_next == []


@pytest.mark.parametrize("code,fatal", [(79, True), (48, True), (95, True), (94, False), (13, False),
                                        (507053, True), (507054, True)])
def test_fatal_event_codes(code, fatal):
    event = DeviceObservation("node-2", 1, "event", 0.0, code=code, message="GPU has fallen off the bus.")
    assert bool(DeviceDetector(DeviceConfig()).update(event, 0.0)) is fatal


def test_an_unknown_reading_kind_is_refused_clearly():
    with pytest.raises(ValueError, match="use health, ecc or event"):
        DeviceDetector(DeviceConfig()).update(DeviceObservation("n", 0, "temperature", 0.0), 0.0)
