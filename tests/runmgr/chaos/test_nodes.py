"""Actions run on the target's own node: here, or in a Ray task pinned to it."""

from __future__ import annotations

import signal
from pathlib import Path

from runmgr.chaos import procfault
from runmgr.chaos.actions import node_raylet_pid
from runmgr.chaos.nodes import LocalRunner, RayNodeRunner, runner_for


def test_a_worker_on_this_host_is_signalled_here_and_another_host_through_ray():
    assert isinstance(runner_for("n1", "127.0.0.1", here={"127.0.0.1", "10.0.0.5"}), LocalRunner)
    remote = runner_for("n2", "10.0.0.9", here={"127.0.0.1", "10.0.0.5"})
    assert isinstance(remote, RayNodeRunner) and remote.node_id == "n2"


def test_a_task_pinned_to_the_node_kills_the_process_and_names_the_nodes_raylet(local_ray, sleeper):
    proc = sleeper()
    node_id = local_ray.get_runtime_context().get_node_id()
    RayNodeRunner(node_id).run(procfault.send, proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=10) == -9
    raylet = node_raylet_pid(node_id)
    assert raylet is not None and "raylet" in Path(f"/proc/{raylet}/cmdline").read_bytes().decode(errors="replace")
