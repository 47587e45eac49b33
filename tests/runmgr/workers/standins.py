"""Stand-ins for the node agents the lost-node probe asks (runmgr/workers/liveness.py), on the
tests' real local Ray: each answers ``waiting`` for its ranks and holds where the test says, until
a file appears, so that a test reaches a moment through the actor's own state."""

from __future__ import annotations

import os
import time

import ray

GATE_POLL_S = 0.01


def wait_for_file(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(GATE_POLL_S)


class StandInAgent:
    """A node's agent: ``waiting`` names its ranks that wait in their warm link (as
    runmgr/workers/node_agent.py's does); ``hold`` keeps its only thread busy until ``release``
    exists (a live node that answers no probe)."""

    def __init__(self, waiting: list[int]) -> None:
        self._waiting = waiting

    def waiting(self) -> list[int]:
        return self._waiting

    def hold(self, release: str) -> None:
        wait_for_file(release)


def remote_agent(waiting: list[int]):
    """An agent actor with one thread: a call waits for the one before it."""
    return ray.remote(num_cpus=0, max_restarts=0)(StandInAgent).remote(waiting)

