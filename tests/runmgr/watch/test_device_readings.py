"""One poll of a node's devices through the real vendor-tool formats (scripted
tools on PATH), turned into the readings the watcher's device detector eats."""

from __future__ import annotations

import stat
from pathlib import Path

from runmgr.watch.device_readings import read_devices
from runmgr.workers.devicepoll import tool_runner
from runmgr.config.watcher import DeviceConfig
from runmgr.watch.devices import DeviceDetector

FIXTURES = Path(__file__).resolve().parents[2] / "health" / "fixtures"


def by_kind(readings, kind):
    return {r.device: r for r in readings if r.kind == kind}


def test_healthy_npus_read_ok_with_zero_ecc(ascend):
    readings = read_devices("node-a", tool_runner(5.0, ascend.path), now=100.0)
    health, ecc = by_kind(readings, "health"), by_kind(readings, "ecc")
    assert {n: r.status for n, r in health.items()} == {0: "OK", 1: "OK"}
    assert {n: (r.correctable, r.uncorrectable) for n, r in ecc.items()} == {0: (0, 0), 1: (0, 0)}
    assert all(r.node == "node-a" and r.time == 100.0 for r in readings)
    assert DeviceDetector(DeviceConfig()).update(ecc[1], 100.0) == []


def test_a_double_bit_error_becomes_a_device_fault_naming_node_and_npu(ascend):
    ascend.set_ecc(1, single=7, double=2)
    ecc = by_kind(read_devices("node-a", tool_runner(5.0, ascend.path), now=1.0), "ecc")
    assert (ecc[1].correctable, ecc[1].uncorrectable) == (7, 2)
    incidents = DeviceDetector(DeviceConfig()).update(ecc[1], 1.0)
    assert len(incidents) == 1
    assert incidents[0].nodes == ("node-a",) and "2 uncorrectable ECC" in incidents[0].description


def test_an_alarm_row_is_read_as_the_npus_health(ascend):
    ascend.set_health(0, "Alarm", "80E01801", "HBM multi-bit ECC error")
    health = by_kind(read_devices("n", tool_runner(5.0, ascend.path), now=1.0), "health")
    assert health[0].status == "Alarm" and health[1].status == "OK"
    assert DeviceDetector(DeviceConfig()).update(health[0], 1.0)[0].evidence["reason"] == "health_alarm"


def test_a_hung_tool_is_an_unknown_reading_within_its_timeout(tmp_path):
    tool = tmp_path / "npu-smi"
    tool.write_text("#!/bin/sh\nexec sleep 100000\n")  # hangs for good: returning at all is the timeout at work
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    readings = read_devices("n", tool_runner(0.5, str(tmp_path)), now=1.0)
    assert [(r.kind, r.status, r.device) for r in readings] == [("health", "UNKNOWN", -1)]
    assert "npu-smi info" in readings[0].message


DMESG = """\
[  812.331456] NVRM: Xid (PCI:0000:1b:00): 48, pid=40211, name=python, An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.
[  812.331902] NVRM: Xid (PCI:0000:1b:00): 79, pid=40211, name=python, GPU has fallen off the bus.
[  901.004117] NVRM: Xid (PCI:0000:3e:00): 13, pid=40377, name=python, Graphics Exception: ESR 0x404600=0x80000002
"""


def test_nvidia_ecc_counts_and_xid_events_map_to_gpu_indices(tmp_path):
    query = FIXTURES / "nvidia_smi" / "q_v100_double_bit.txt"  # GPUs 1A:00.0 and 1B:00.0
    (tmp_path / "dmesg.txt").write_text(DMESG)
    (tmp_path / "nvidia-smi").write_text(f"#!/bin/sh\nexec /bin/cat '{query}'\n")
    (tmp_path / "dmesg").write_text(f"#!/bin/sh\nexec /bin/cat '{tmp_path / 'dmesg.txt'}'\n")
    for name in ("nvidia-smi", "dmesg"):
        (tmp_path / name).chmod(0o755)
    readings = read_devices("g", tool_runner(5.0, str(tmp_path)), now=1.0)
    ecc = by_kind(readings, "ecc")
    assert sorted(ecc) == [0, 1] and any((r.uncorrectable or 0) > 0 for r in ecc.values())
    events = [(r.device, r.code) for r in readings if r.kind == "event"]
    assert events == [(1, 48), (1, 79), (-1, 13)]  # 3e:00 is not a GPU nvidia-smi lists
    detector = DeviceDetector(DeviceConfig())
    fatal = [i for r in readings if r.kind == "event" for i in detector.update(r, 1.0)]
    assert ["Xid 48" in i.description or "Xid 79" in i.description for i in fatal] == [True, True]


def test_a_node_without_vendor_tools_reads_nothing(tmp_path):
    assert read_devices("cpu-node", tool_runner(5.0, str(tmp_path)), now=1.0) == []
