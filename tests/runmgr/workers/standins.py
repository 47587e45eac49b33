"""Stand-ins for a warm group's actors, on the tests' real local Ray: each answers the calls the
driver makes of a rank or a spare (``describe``, ``waiting``, ``run_spare``) and holds where the
test says, until a file appears, so that a test reaches a moment through the actor's own state."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import ray

from runmgr.controller.group import WorkerInfo

GATE_POLL_S = 0.01


def wait_for_file(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(GATE_POLL_S)


class StandInRank:
    """A rank: ``waiting`` says whether it waits in its warm link; ``hold`` keeps its only
    thread busy until ``release`` exists (a live rank that answers no probe)."""

    def __init__(self, waiting: bool) -> None:
        self._waiting = waiting

    def waiting(self) -> bool:
        return self._waiting

    def hold(self, release: str) -> None:
        wait_for_file(release)


class StandInSpare:
    """A spare: it starts, builds its model until ``built`` exists, then waits to be named
    (``run_spare`` returns only when its actor dies)."""

    def __init__(self, built: str) -> None:
        self.built = built
        self._waiting = False

    def describe(self) -> WorkerInfo:
        return WorkerInfo(-1, os.getpid(), ray.get_runtime_context().get_node_id(), "127.0.0.1")

    def run_spare(self) -> dict:
        wait_for_file(self.built)
        self._waiting = True
        threading.Event().wait()
        return {"result": "unreachable"}

    def waiting(self) -> bool:
        return self._waiting


def remote_rank(waiting: bool):
    """A rank actor with one thread: a call waits for the one before it."""
    return ray.remote(num_cpus=0, max_restarts=0)(StandInRank).remote(waiting)


def remote_spare(built: Path, **options):
    """A spare actor with two threads, as the trainer's actors have."""
    return ray.remote(num_cpus=0, max_concurrency=2, max_restarts=0)(StandInSpare).options(**options).remote(
        str(built))
