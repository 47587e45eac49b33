"""The exclusion history: what launch honours, lemons after three
exclusions, and a crash mid-write that loses nothing earlier."""

from __future__ import annotations

import json

from runmgr.healthcheck.exclusions import CheckRecord, ExclusionStore, NodeRecord
from runmgr.healthcheck.nodes import RayNode, history_keys, nodes_from_ray_table


def node(key: str, verdict: str, *reasons: str) -> NodeRecord:
    return NodeRecord(f"id-{key}", key, key, verdict, tuple(reasons))


def check(n: int, *nodes: NodeRecord, source: str = "health-check") -> CheckRecord:
    return CheckRecord(f"check-{n}", float(n), source, nodes)


def test_the_latest_verdict_of_each_machine_decides_what_stays_out(tmp_path):
    store = ExclusionStore.for_runs_root(tmp_path)
    store.record(check(1, node("host:a", "exclude", "ECC"), node("host:b", "exclude", "slow")))
    store.record(check(2, node("host:a", "admit")))  # a repaired; b not seen again
    current = store.current_exclusions()
    assert sorted(current) == ["host:b"] and current["host:b"].reasons == ("slow",)
    assert store.path == tmp_path / ".health" / "exclusions.jsonl"


def test_a_machine_excluded_in_three_checks_is_a_lemon(tmp_path):
    store = ExclusionStore(tmp_path)
    for n in range(1, 4):
        store.record(check(n, node("host:a", "exclude", "ECC"), node("host:b", "admit"),
                           source="launch" if n == 2 else "health-check"))
    store.record(check(4, node("host:b", "exclude", "mount")))
    lemons = store.lemons()
    assert list(lemons) == ["host:a"]
    assert lemons["host:a"].checks == ("check-1", "check-2", "check-3")
    assert "excluded in 3 checks" in lemons["host:a"].note()


def test_a_torn_last_line_is_skipped_and_the_next_check_still_lands(tmp_path):
    store = ExclusionStore(tmp_path)
    store.record(check(1, node("host:a", "exclude", "ECC")))
    with open(store.path, "a") as handle:  # a crash in the middle of the second write
        handle.write(check(2, node("host:b", "exclude", "x")).to_json()[:40])
    assert [c.check_id for c in store.checks()] == ["check-1"]
    store.record(check(3, node("host:c", "exclude", "slow")))
    assert [c.check_id for c in store.checks()] == ["check-1", "check-3"]
    assert all(json.loads(line) for line in store.path.read_text().splitlines()[-1:])


def test_history_follows_host_names_unless_ray_nodes_share_a_host():
    table = [{"NodeID": "aa", "Alive": True, "NodeManagerAddress": "10.0.0.1", "NodeManagerHostname": "h1"},
             {"NodeID": "bb", "Alive": True, "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "h2"},
             {"NodeID": "cc", "Alive": True, "NodeManagerAddress": "10.0.0.2", "NodeManagerHostname": "h2"},
             {"NodeID": "dd", "Alive": False, "NodeManagerAddress": "10.0.0.3", "NodeManagerHostname": "h3"}]
    nodes = nodes_from_ray_table(table)
    assert [n.node_id for n in nodes] == ["aa", "bb", "cc"]
    assert history_keys(nodes) == {"aa": "host:h1", "bb": "ray:bb", "cc": "ray:cc"}
    assert RayNode("0123456789abcdef", "10.0.0.1", "h1").display() == "h1 0123456789ab"


def test_readmit_admits_a_machine_s_current_exclusions_and_keeps_its_history(tmp_path):
    store = ExclusionStore(tmp_path)
    pod = NodeRecord("aa", "host:runmgr-gpu-worker-x1", "runmgr-gpu-worker-x1 aa", "exclude", ("ECC",), "gpu-07")
    for n in range(1, 4):  # a lemon: excluded three times
        store.record(check(n, pod, node("host:h2", "exclude", "slow"),
                           NodeRecord("cc", "ray:cc", "h3 cc", "exclude", ("mount",))))
    cleared = store.readmit(["gpu-07", "h3", "nowhere"], "readmit-1", 9.0)
    assert {name: [r.key for r in found] for name, found in cleared.items()} == {
        "gpu-07": ["host:runmgr-gpu-worker-x1"], "h3": ["ray:cc"], "nowhere": []}
    assert sorted(store.current_exclusions()) == ["host:h2"]  # what launch still keeps out
    assert set(store.lemons()) == {"host:runmgr-gpu-worker-x1", "host:h2", "ray:cc"}  # history kept
    lines = len(store.path.read_text().splitlines())
    assert store.readmit(["gpu-07"], "readmit-2", 10.0) == {"gpu-07": []}
    assert len(store.path.read_text().splitlines()) == lines  # nothing to admit: nothing written
