"""The real fleet check over simulated nodes (runmgr/scale/fleet.py): every planted bad node is
excluded for its own reason, no healthy one is, and the collective tests pair nodes in rounds."""

from __future__ import annotations

from runmgr.scale.fleet import PlantedFleet, check_simulated_fleet


def test_every_planted_bad_node_among_512_is_excluded_for_its_fault_and_no_healthy_one_is():
    fleet = PlantedFleet(512, seed=3)
    lines = []
    check, probes = check_simulated_fleet(fleet, lines.append)
    planted = probes.planted
    assert {kind: len(nodes) for kind, nodes in planted.items()} == {
        "slow_compute": 3, "slow_network": 2, "ecc": 3, "mount": 3}
    assert set(check.excluded) == fleet.bad()
    reasons = {node: " ".join(check.excluded[node]) for node in check.excluded}
    assert all("matmul_tflops" in reasons[n] for n in planted["slow_compute"])
    assert all("uncorrectable" in reasons[n] for n in planted["ecc"])
    assert all("not on a lustre mount" in reasons[n] for n in planted["mount"])
    assert all("network or PCIe is slow" in reasons[n] for n in planted["slow_network"])
    # Pairs, then each member of a slow pair with a healthy node: rounds, not all pairs.
    outcome = check.collectives
    left = 512 - len(planted["slow_compute"]) - len(planted["ecc"]) - len(planted["mount"])
    assert len(outcome.first) == left // 2  # the nodes the node probes kept, in pairs (an odd one joins the last)
    assert len(outcome.second) == 2 * len(planted["slow_network"])
    assert f"collectives: {left // 2} groups, 4 re-pairings, 0 failed" in lines
