"""A node of a Megatron-style job, in this process (no Ray): it stops every
process its command started when its driver is gone, so a crashed driver
leaves no orphan behind."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from runmgr.workers import proctree
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
