"""Where a fault's action runs: on the node of its target process.

A pid means something only on its own host, so an action on a worker runs
on that worker's node: here, when the worker's address is one of this
host's, else in a Ray task pinned to the worker's node. (Several Ray nodes
of a test cluster share this host and its pids: they run here, correctly.)
"""

from __future__ import annotations

import os
import socket
from typing import Any, Callable, Protocol

REMOTE_TIMEOUT_S = 30.0
"""How long a pinned Ray task may take to run an action."""


class NodeRunner(Protocol):
    """Runs a picklable function on one node and returns its result."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any: ...


class NodeUnreachable(ConnectionError):
    """The target's node could not run the action (gone, or no room for a task)."""


class LocalRunner:
    """The target lives on this host."""

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class RayNodeRunner:
    """The target lives on another host: a Ray task pinned to its node runs the action."""

    def __init__(self, node_id: str) -> None:
        self.node_id = node_id

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the node. An exception ``fn`` raises comes back as its own
        type (Ray's task errors are instances of their cause); a node that cannot
        run the task raises NodeUnreachable."""
        import ray
        from ray.exceptions import RayError, RayTaskError
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        task = ray.remote(num_cpus=0, max_retries=0)(fn).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(self.node_id, soft=False))
        try:
            return ray.get(task.remote(*args), timeout=REMOTE_TIMEOUT_S)
        except RayTaskError:
            raise
        except RayError as exc:
            raise NodeUnreachable(f"node {self.node_id[:12]} did not run {fn.__name__}: {exc}") from exc


def local_addresses() -> set[str]:
    """Addresses that name this host (loopback, host name, Ray's view of it)."""
    addresses = {"127.0.0.1", "localhost", "::1", socket.gethostname()}
    try:
        addresses.add(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass  # an unresolvable host name: the other addresses still count
    try:
        import ray.util

        addresses.add(ray.util.get_node_ip_address())
    except (ImportError, RuntimeError, OSError):
        pass
    return addresses


def runner_for(node_id: str, node_ip: str, here: set[str] | None = None) -> NodeRunner:
    """A runner for a process on ``node_ip`` (Ray node ``node_id``)."""
    return LocalRunner() if node_ip in (here if here is not None else local_addresses()) else RayNodeRunner(node_id)


def raylet_pid() -> int | None:
    """The pid of the raylet of the node this runs on (set in every Ray worker's
    environment): how a scripted device tool knows which node it speaks for."""
    value = os.environ.get("RAY_RAYLET_PID")
    return int(value) if value and value.isdigit() else None
