"""Ray's own messages to the driver ("a worker died ...", in ANSI colours)
go to a file in the run directory, not into the run's output. (That a local
Ray's ranks run at the driver's niceness is checked on every node of the Ray
that tests/runmgr/test_ray_start_timeout.py's retry starts: no Ray of its own.)"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import ray

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig
from runmgr.errors import ClusterError

ROOT = Path(__file__).resolve().parents[2]

MESSAGE_DEADLINE_S = 120


DEAD_WORKER_SCRIPT = """
import os, signal, sys, time
from pathlib import Path
import ray
from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig

log = Path(sys.argv[1])
local = ray_cluster.connect(ClusterConfig(num_workers=1), messages_to=log)
try:
    @ray.remote
    class Sleeper:
        def pid(self):
            return os.getpid()

        def sleep(self):
            time.sleep(600)

    sleeper = Sleeper.remote()
    pid = ray.get(sleeper.pid.remote())
    pending = sleeper.sleep.remote()
    os.kill(pid, signal.SIGKILL)
    try:
        ray.get(pending)
    except ray.exceptions.RayActorError:
        pass
    deadline = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < deadline and not (log.is_file() and "(raylet)" in log.read_text()):
        time.sleep(0.2)  # Ray's listener thread delivers the message when it comes
finally:
    print("session", local.local_head.get_session_dir_path())
    ray_cluster.disconnect(local)
from ray._private import worker as ray_worker
print("restored" if not isinstance(ray_worker.print_to_stdstream, ray_cluster.RayMessageLog) else "still ours")
"""


def test_a_dead_worker_message_goes_to_the_log_without_colour_and_the_local_ray_reports_its_usage_nowhere(
        tmp_path):
    # A process of its own: the test process may already hold a Ray (other tests' fixture). Its
    # environment without Ray's usage variables, which an earlier local Ray in this process set.
    log = tmp_path / ray_cluster.RAY_MESSAGES_FILE
    env = {name: value for name, value in os.environ.items() if name not in ray_cluster.LOCAL_RAY_ENVIRONMENT}
    result = subprocess.run([sys.executable, "-c", DEAD_WORKER_SCRIPT, str(log), str(MESSAGE_DEADLINE_S)],
                            capture_output=True, text=True, cwd=ROOT, env=env, timeout=MESSAGE_DEADLINE_S + 120)
    assert result.returncode == 0, result.stderr[-3000:]
    text = log.read_text()
    assert "(raylet)" in text and "\x1b[" not in text
    assert "(raylet)" not in result.stdout + result.stderr and "\x1b[" not in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "restored"  # Ray's own printer again
    # Ray's usage statistics off in the Ray a run starts, and its report server named nowhere.
    session = Path(next(line.split(" ", 1)[1] for line in result.stdout.splitlines() if line.startswith("session ")))
    logs = {path.name: path.read_text(errors="replace") for path in (session / "logs").glob("*") if path.is_file()}
    assert "Usage reporting is disabled." in logs["dashboard.log"]
    assert not [name for name, text in logs.items() if "usage-stats.ray.io" in text]


@pytest.mark.parametrize("user, kept", [({}, ray_cluster.LOCAL_RAY_ENVIRONMENT),
                                        ({"RAY_USAGE_STATS_ENABLED": "1"}, {"RAY_USAGE_STATS_ENABLED": "1"}),
                                        ({"RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/"},
                                         {"RAY_USAGE_STATS_ENABLED": "0",
                                          "RAY_USAGE_STATS_REPORT_URL": "http://127.0.0.1:9/"})])
def test_a_local_ray_s_usage_statistics_are_off_unless_its_user_turned_them_on(user, kept):
    environ = {"PATH": "/usr/bin", **user}
    ray_cluster.keep_local_ray_offline(environ)
    assert environ == {"PATH": "/usr/bin", **kept}

def test_a_local_ray_that_does_not_start_in_ray_s_time_is_one_line_and_its_processes_are_stopped(monkeypatch):
    """Ray waits a hard-coded 30 s for its raylet and raises a bare Exception (seen at load ~15);
    each try is stopped, the last says so in one line. Other errors stay as they are
    (tests/runmgr/test_ray_start_timeout.py: real processes, the retries)."""
    stopped, started = [], []
    # Earlier tests in the same pytest process may have left a Ray initialised here.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda: stopped.append(True))

    class NoProcesses:
        """Stands for a try's local Ray processes: the test's ray.init is what fails, so starting
        real ones only cost four Ray starts (about 17 CPU-seconds and 36 s of the suite);
        test_ray_start_timeout.py starts real ones and checks they are stopped."""

        address = "127.0.0.1:1"

        def __init__(self, *args, **kwargs) -> None:
            started.append(True)

    monkeypatch.setattr(ray_cluster, "LocalCluster", NoProcesses)

    def timed_out(**kwargs):
        raise Exception("The current node timed out during startup. This could happen because some of the "
                        "raylet failed to startup or the GCS has become overloaded.")

    monkeypatch.setattr(ray, "init", timed_out)
    with pytest.raises(ClusterError) as caught:
        ray_cluster.connect(ClusterConfig(num_workers=1))
    line = str(caught.value)
    assert line.startswith("the local Ray did not start") and "run the same command again when it is less busy" in line
    assert "\n" not in line and stopped == started == [True] * ray_cluster.LOCAL_START_TRIES

    def other(**kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(ray, "init", other)
    with pytest.raises(RuntimeError, match="something else"):
        ray_cluster.connect(ClusterConfig(num_workers=1))


def test_a_ray_shutdown_that_blocks_ends_the_local_ray_and_is_waited_for_again(monkeypatch):
    """As Ray's did once in a suite (its GCS subscriber's close, a call without a deadline): the
    local Ray's processes are ended, which ends that call, and the shutdown then returns."""
    ended = threading.Event()
    monkeypatch.setattr(ray, "shutdown", lambda: ended.wait(60))
    assert ray_cluster.shutdown_ray(ended.set, wait_s=0.2)
    assert ended.is_set()


def test_a_ray_shutdown_that_returns_ends_nothing(monkeypatch):
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    assert ray_cluster.shutdown_ray(lambda: pytest.fail("a Ray whose shutdown returned was ended"), wait_s=60)


def test_a_joined_ray_whose_shutdown_blocks_is_left_to_its_own(monkeypatch):
    released = threading.Event()
    monkeypatch.setattr(ray, "shutdown", lambda: released.wait(60))
    try:
        assert not ray_cluster.shutdown_ray(None, wait_s=0.2)  # said, and the driver goes on
    finally:
        released.set()
