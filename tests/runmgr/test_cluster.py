"""Ray's own messages to the driver ("a worker died ...", in ANSI colours)
go to a file in the run directory, not into the run's output."""

from __future__ import annotations

import os
import signal
import time

import pytest

from runmgr import cluster as ray_cluster
from runmgr.config.schema import ClusterConfig

MESSAGE_DEADLINE_S = 120


def test_a_dead_worker_message_goes_to_the_log_without_colour(tmp_path, capfd):
    import ray

    log = tmp_path / ray_cluster.RAY_MESSAGES_FILE
    local = ray_cluster.connect(ClusterConfig(num_workers=1), messages_to=log)
    try:
        @ray.remote
        class Sleeper:
            def pid(self) -> int:
                return os.getpid()

            def sleep(self) -> None:
                time.sleep(600)

        sleeper = Sleeper.remote()
        pid = ray.get(sleeper.pid.remote())
        pending = sleeper.sleep.remote()
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(pending)
        deadline = time.monotonic() + MESSAGE_DEADLINE_S
        while time.monotonic() < deadline and not (log.is_file() and "(raylet)" in log.read_text()):
            time.sleep(0.2)  # Ray's listener thread delivers the message when it comes
    finally:
        ray_cluster.disconnect(local)
    text = log.read_text()
    assert "(raylet)" in text and "\x1b[" not in text
    captured = capfd.readouterr()
    assert "(raylet)" not in captured.out + captured.err and "\x1b[" not in captured.out
    from ray._private import worker as ray_worker

    assert not isinstance(ray_worker.print_to_stdstream, ray_cluster.RayMessageLog)  # Ray's own again
