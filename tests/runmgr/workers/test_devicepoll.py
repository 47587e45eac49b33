"""The mid-run device poll on a real Ray node: when the node's npu-smi starts
reporting an uncorrectable ECC error, a reading saying so arrives within one
poll interval, and the watcher's detector makes it an incident."""

from __future__ import annotations

import time

from runmgr.workers.devicepoll import DevicePollGroup
from runmgr.config.watcher import DeviceConfig
from runmgr.watch.devices import DeviceDetector

INTERVAL_S = 1.0


def drain_until(group, predicate, timeout_s):
    seen, deadline = [], time.time() + timeout_s
    while time.time() < deadline:
        seen += group.drain()
        hits = [r for r in seen if predicate(r)]
        if hits:
            return hits, seen
        time.sleep(0.1)
    return [], seen


def test_an_ecc_error_appearing_mid_run_is_read_within_one_interval(local_ray, ascend):
    node_id = local_ray.get_runtime_context().get_node_id()
    group = DevicePollGroup([node_id], INTERVAL_S, path=ascend.path)
    group.start()
    try:
        healthy, _ = drain_until(group, lambda r: r.kind == "ecc", 10)
        assert healthy and all(r.uncorrectable == 0 for r in healthy)
        assert {r.node for r in healthy} == {node_id[:12]}

        broke_at = time.time()
        ascend.set_ecc(1, single=3, double=2)
        hits, _ = drain_until(group, lambda r: r.kind == "ecc" and (r.uncorrectable or 0) > 0, 10)
        assert hits, "no reading showed the ECC error"
        first = min(hits, key=lambda r: r.time)
        assert first.device == 1 and first.uncorrectable == 2
        assert first.time - broke_at <= INTERVAL_S + 0.5  # read by the next poll

        incidents = DeviceDetector(DeviceConfig()).update(first, first.time)
        assert [i.nodes for i in incidents] == [(node_id[:12],)]
    finally:
        group.stop()


def test_a_node_that_joins_later_is_polled_once_added(local_ray, ascend):
    """A replacement node admitted mid-lineage: the running group starts polling it."""
    node_id = local_ray.get_runtime_context().get_node_id()
    group = DevicePollGroup([], INTERVAL_S, path=ascend.path)
    group.start()
    try:
        assert group.drain(wait_s=2 * INTERVAL_S) == []  # nothing polled yet
        group.add_node(node_id)
        group.add_node(node_id)  # once
        hits, seen = drain_until(group, lambda r: r.kind == "ecc", 10)
        assert hits and {r.node for r in seen} == {node_id[:12]}
        assert group.node_ids == [node_id]
    finally:
        group.stop()
