"""A node of a Megatron-style job, in this process (no Ray): it stops every
process its command started when its driver is gone, so a crashed driver
leaves no orphan behind; it reads its node's devices itself and drains the
readings with its output."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from runmgr.chaos.devicetool import DeviceTools
from runmgr.config.watcher import DeviceConfig
from runmgr.nodes import node_name
from runmgr.watch.devices import DeviceDetector
from runmgr.watch.incidents import DEVICE_FAULT
from runmgr.workers import proctree
from runmgr.workers.devicepoll import DevicePollSettings
from runmgr.workers.lease import EXIT_DRIVER_LOST, DriverIdentity, process_start_ticks
from runmgr.config.argv import flag_value
from runmgr.workers.megatron_node import MegatronNode
from tests.runmgr.workers.megatron_helpers import SAFETY_S, SCRIPT


def wait_for(predicate) -> None:
    deadline = time.monotonic() + SAFETY_S
    while not predicate():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)


def test_a_node_whose_driver_died_stops_its_command_and_what_it_started_then_ends(tmp_path: Path):
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    identity = replace(DriverIdentity.of_this_process(), pid=driver.pid, start_ticks=process_start_ticks(driver.pid))
    exited: list[int] = []
    ended = threading.Event()
    node = MegatronNode(0, lease_s=600.0, driver=identity, exit=lambda code: (exited.append(code), ended.set()),
                        job_alive=lambda: None)
    gate = tmp_path / "gate"
    gate.mkdir()
    command = node.launch([sys.executable, str(SCRIPT), "--mode", "forever", "--gate", str(gate)],
                          {"RANK": "0", "WORLD_SIZE": "1"})
    wait_for(lambda: (gate / "pids-0").exists())
    pids = [int(p) for p in (gate / "pids-0").read_text().split()]
    assert pids[0] == command and all(proctree.alive(pid) for pid in pids)

    driver.kill()
    driver.wait()
    wait_for(ended.is_set)
    assert exited == [EXIT_DRIVER_LOST]
    assert [pid for pid in pids if proctree.alive(pid)] == []  # the command and the grandchild it started


def test_the_tracker_flag_is_read_in_both_spellings():
    assert flag_value(["--a", "1", "--result-rejected-tracker-filename", "t.txt"],
                      "--result-rejected-tracker-filename") == "t.txt"
    assert flag_value(["--result-rejected-tracker-filename=u.txt"], "--result-rejected-tracker-filename") == "u.txt"
    assert flag_value(["--save", "x"], "--result-rejected-tracker-filename") is None


def test_every_line_printed_before_the_end_comes_with_the_exit_even_when_a_leftover_holds_the_pipe(tmp_path: Path):
    """The exit is told only with every line the command printed (the last without its newline
    too, ``\\r\\n`` read as a newline); a process it left behind holding the pipe open does not
    hold the exit back."""
    node = MegatronNode(0, lease_s=600.0, job_alive=lambda: None)
    script = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])  # holds the pipe\n"
              "for i in range(5000): print(f'line {i}')\n"
              "sys.stdout.write('windows\\r\\nlast')\n")
    node.launch([sys.executable, "-c", script], {})
    drained = node.drain(SAFETY_S)
    node.stop(5.0)
    assert drained["exit"] == 0
    assert [text for _, text in drained["lines"]] == [f"line {i}" for i in range(5000)] + ["windows", "last"]


def test_a_node_reads_its_devices_and_the_ecc_error_chaos_scripts_comes_with_its_drain(tmp_path: Path, monkeypatch):
    """The device poll folded into the node actor (no poller actor beside it): it reads chaos's
    scripted npu-smi, and each drain returns the readings; an uncorrectable ECC error that
    appears mid-run is read and is an incident naming the node."""
    node_id = "c" * 56
    tools = DeviceTools(tmp_path / "tools")
    tools.install()
    monkeypatch.setenv("RUNMGR_NODE_ID", node_id)  # the node the scripted tool is on (inside Ray: the raylet's pid)
    settings = DevicePollSettings(0.1, path=f"{tools.directory}{os.pathsep}{os.environ['PATH']}")
    node = MegatronNode(0, lease_s=600.0, job_alive=lambda: None, device_poll=settings, node=node_name(node_id))
    readings: list = []

    def ecc_read(uncorrectable: bool) -> bool:
        readings.extend(r for r in node.drain(0.0)["devices"] if r.kind == "ecc")
        return any((r.uncorrectable > 0) == uncorrectable for r in readings)

    try:
        node.launch([sys.executable, "-c", "import time; time.sleep(600)"], {})  # a running job
        wait_for(lambda: ecc_read(uncorrectable=False))
        tools.break_node(node_id, raylet_pid=None)  # after healthy readings came: the next read shows it
        wait_for(lambda: ecc_read(uncorrectable=True))
    finally:
        node._device_poll.stop()  # this process outlives the node: no read after the test
        node.stop(grace_s=5.0)
    broken = min((r for r in readings if r.uncorrectable), key=lambda r: r.time)
    assert (broken.node, broken.device, broken.uncorrectable) == (node_name(node_id), 0, 2)
    incidents = DeviceDetector(DeviceConfig()).update(broken, broken.time)
    assert [i.kind for i in incidents] == [DEVICE_FAULT] and incidents[0].nodes == (node_name(node_id),)
