"""The reaper of a local Ray, on real processes: when its driver goes (kill -9)
it kills every process that writes into the Ray's session directory, and
nothing else: not another session's processes (even one whose name starts
like ours), not a reader of the logs, not the driver that asks for the reap."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from runmgr.reaper import session_processes
from tests.e2e.harness import pid_gone

ROOT = Path(__file__).resolve().parents[2]
HOLD_OPEN = "import sys, time; f = open(sys.argv[1], sys.argv[2]); print('ready', flush=True); time.sleep(600)"
DRIVER = """
import sys, time
from runmgr.reaper import Reaper
log = open(sys.argv[1] + "/logs/driver.log", "a")  # a Ray driver writes into its session too
reaper = Reaper.start(sys.argv[1])
print(reaper.process.pid, flush=True)
if sys.argv[2] == "reap":
    reaper.reap()
    print("driver alive after the reap", flush=True)
else:
    time.sleep(600)
"""


@pytest.fixture
def spawned():
    """Start processes that are the test's own; every one is killed at the end."""
    procs: list[subprocess.Popen] = []

    def spawn(*args: str) -> tuple[subprocess.Popen, str]:
        """The process, once it says it holds what it must, and what it said."""
        proc = subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        return proc, proc.stdout.readline().strip()

    yield spawn
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def sessions(tmp_path: Path) -> tuple[Path, Path]:
    ours, theirs = tmp_path / "session_1", tmp_path / "session_12"  # a name that starts like ours
    for session in (ours, theirs):
        (session / "logs").mkdir(parents=True)
        (session / "logs" / "raylet.out").write_text("")
    return ours, theirs


def test_a_killed_driver_takes_its_rays_processes_and_only_them(tmp_path, spawned):
    ours, theirs = sessions(tmp_path)
    writer, _ = spawned("-c", HOLD_OPEN, str(ours / "logs" / "worker.out"), "a")
    appender, _ = spawned("-c", HOLD_OPEN, str(ours / "logs" / "raylet.out"), "r+")
    reader, _ = spawned("-c", HOLD_OPEN, str(ours / "logs" / "raylet.out"), "r")  # tail -f of our logs
    other_ray, _ = spawned("-c", HOLD_OPEN, str(theirs / "logs" / "worker.out"), "a")
    found = set(session_processes(str(ours)))
    assert {writer.pid, appender.pid} <= found and not {reader.pid, other_ray.pid} & found

    driver, reaper_pid = spawned("-c", DRIVER, str(ours), "sleep")
    driver.send_signal(signal.SIGKILL)
    driver.wait()

    # Children of this test: a killed one stays a zombie until waited for.
    assert writer.wait(timeout=30) == -signal.SIGKILL and appender.wait(timeout=30) == -signal.SIGKILL
    assert pid_gone(int(reaper_pid))  # its work done, the reaper is gone too
    assert reader.poll() is None and other_ray.poll() is None


def test_a_driver_that_asks_for_the_reap_is_spared_and_waits_for_it(tmp_path, spawned):
    ours, _ = sessions(tmp_path)
    worker, _ = spawned("-c", HOLD_OPEN, str(ours / "logs" / "worker.out"), "a")
    driver, _ = spawned("-c", DRIVER, str(ours), "reap")
    assert driver.stdout.readline().strip() == "driver alive after the reap"
    assert worker.wait(timeout=30) == -signal.SIGKILL  # gone before the reap returned
    assert driver.wait(timeout=30) == 0
