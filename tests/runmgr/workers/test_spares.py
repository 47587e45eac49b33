"""A warm group's spares (runmgr/workers/spares.py) on real actors of a real local Ray: a spare
counts as ready only once its actor has started and it waits to be named; a refill starts a
new one in the background; a spare that dies or never starts is lost, said in one line."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable

import pytest
import ray

from runmgr.controller.group import SpareEvent
from runmgr.workers.spares import Slot, SparePool
from tests.runmgr.workers.standins import remote_spare

SAFETY_S = 60.0
"""Only against a test that would otherwise never end; no assertion depends on it."""
POLL_S = 0.05


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def built(tmp_path: Path) -> Path:
    """Exists once the spares have built their model."""
    return tmp_path / "built"


def pool_of(built: Path, wanted: int = 1, clock: Callable[[], float] = time.monotonic, **options) -> SparePool:
    return SparePool(wanted, lambda strategy: remote_spare(built, **options), lambda actor: actor.run_spare.remote(),
                     start_timeout_s=30.0, clock=clock)


def poll_until(pool: SparePool, kind: str) -> list[SpareEvent]:
    """Every event up to the first of ``kind``."""
    seen: list[SpareEvent] = []
    deadline = time.monotonic() + SAFETY_S
    while not any(event.kind == kind for event in seen):
        assert time.monotonic() < deadline, f"no {kind} event; seen {seen}"
        seen += pool.poll()
        time.sleep(POLL_S)
    return seen


def started(pool: SparePool, built: Path) -> None:
    actor = remote_spare(built)
    pool.add_started([actor], [None], [ray.get(actor.describe.remote())])


def test_a_started_spare_is_ready_only_once_it_waits_to_be_named(local_ray, built):
    pool = pool_of(built)
    started(pool, built)
    try:
        spare = pool.spares[0]
        while spare.probe is None or spare.probe not in ray.wait([spare.probe], timeout=SAFETY_S)[0]:
            assert pool.poll() == []
        assert pool.poll() == [] and pool.ready() == []  # its model is being built: asked, not ready
        built.touch()
        [event] = poll_until(pool, "spare_ready")
        assert (event.ready, event.wanted, event.worker) == (1, 1, spare.info)
        assert event.text == f"warm spare ready on node {spare.info.node_id[:12]} (pid {spare.info.pid}) (1 of 1 ready)"
        assert pool.usable([]) == [spare] and pool.usable([spare.info.node_id[:12]]) == []
        ray.kill(spare.actor, no_restart=True)
        [lost] = poll_until(pool, "spare_lost")
        assert (lost.ready, pool.spares) == (0, [])
        assert lost.text.startswith(f"warm spare on node {spare.info.node_id[:12]} (pid {spare.info.pid}) lost: ")
    finally:
        pool.shutdown()


def test_a_refill_starts_in_the_background_and_never_past_the_spares_wanted(local_ray, built):
    pool = pool_of(built)
    node = ray.get_runtime_context().get_node_id()
    try:
        [refilling] = pool.refill([Slot(None, node), Slot(None, node)], [0, 1])  # one spare wanted
        assert refilling.kind == "spare_refilling" and len(pool.spares) == 1 and pool.ready() == []
        assert refilling.text == (f"a new warm spare starts on node {node[:12]} in the slot rank 0 left, "
                                  f"to replace the spare it took (0 of 1 ready)")
        built.touch()
        [ready] = poll_until(pool, "spare_ready")
        assert ready.worker == pool.spares[0].info and ready.ready == 1
        assert pool.refill([Slot(None, node)], [1]) == []  # full
    finally:
        pool.shutdown()


def test_a_spare_that_never_starts_is_given_up_at_the_start_timeout(local_ray, built):
    clock = Clock()
    pool = pool_of(built, clock=clock, num_cpus=10_000)  # no node of this Ray has room for it
    node = ray.get_runtime_context().get_node_id()
    try:
        pool.refill([Slot(None, node)], [0])
        assert pool.poll() == []
        clock.now += 31
        [lost] = pool.poll()
        assert lost.kind == "spare_lost" and pool.spares == []
        assert lost.text == "warm spare lost: its actor did not start within 30 s (no room for it on its node?); " \
                            "it is not replaced (0 of 1 ready)"
    finally:
        pool.shutdown()
