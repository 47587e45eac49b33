"""A node agent on accelerators (runmgr/workers/node_agent.py), on a real local Ray that
advertises 3 GPUs and 2 NPUs it does not have (devices_cluster.py, in a process of its own): Ray
assigns their ids and sets the visible-devices variables as on a real node. On the NPUs, the agent
of the one node holds both ranks' bundles (a rank's CPU and one device each, summed) inside the
placement group that reserves them on its node for its whole life (removed when it ends), and
each rank it forks sees exactly its own device in the variable Ray would have set for a per-rank
actor (ASCEND_RT_VISIBLE_DEVICES for an Ascend NPU), the two ranks different ones. The ranks say
what they see through the agent's real fork path and push (their error, before they train: the
test's machine has no device).

Warm, on the GPUs (CUDA_VISIBLE_DEVICES; one agent per scenario, each a Ray worker and a fork
server): the agent holds the ranks' and the spare's bundles, each rank and the spare see a device
of their own; once rank 1 is killed and
the spare named rank 1, the spare keeps its device and the refill gets the one rank 1 left; no
two live processes share one, and a spare past the node's devices is refused in the agent's
words (runmgr/agents/device_slices.py), not left to a start timeout."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("devices_cluster.py")
WORLD, DEVICES_PER_RANK, CPUS_PER_RANK = 2, 1, 0.5


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("devices")
    result = subprocess.run([sys.executable, str(HELPER), str(root)], cwd=ROOT, capture_output=True, text=True,
                            timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def visible(failure_text: str) -> dict[str, str]:
    """``{variable: value}`` from a rank's ``sees CUDA_VISIBLE_DEVICES=1 ASCEND_RT_VISIBLE_DEVICES=-``."""
    (line,) = [line for line in failure_text.splitlines() if "RuntimeError: sees " in line]
    return dict(re.findall(r"(\w+)=(\S+)", line))


@pytest.mark.parametrize(("kind", "resource", "variable"), [
    ("npu", "NPU", "ASCEND_RT_VISIBLE_DEVICES"),  # the GPUs': the warm test below
])
def test_each_forked_rank_sees_only_its_own_device_of_those_its_agent_holds(seen, kind, resource, variable):
    run = seen[kind]
    # One agent for the one node, holding exactly world x devices_per_worker devices (and the
    # ranks' CPUs), inside the one placement group left: its bundle on that node, held while the
    # agent lives (no gap in which another job could take the room), removed once it ends.
    held = {resource: float(WORLD * DEVICES_PER_RANK), "CPU": WORLD * CPUS_PER_RANK}
    assert run["held"] == [held]
    assert run["groups"] == [{"state": "CREATED", "bundles": [held], "nodes": [seen["node"]]}]
    assert run["groups_after"] == []
    assert [rank for rank, _ in run["workers"]] == [0, 1] and len({pid for _, pid in run["workers"]}) == 2
    failures = sorted(run["failures"])
    assert [(rank, how) for rank, how, _ in failures] == [(0, "error"), (1, "error")]
    sees = [visible(text) for _, _, text in failures]
    # Each one device id (its agent sees both), the two ranks different ones.
    assert sorted(s[variable] for s in sees) == ["0", "1"]


def test_a_warm_spare_keeps_its_own_device_when_named_and_the_refill_gets_the_lost_ranks(seen):
    warm = seen["warm"]
    # One agent for the one node, holding the 2 ranks' and the spare's GPU and CPU, inside the one
    # placement group's bundle on that node while it lives; the group is removed with the agent.
    held = {"GPU": 3.0, "CPU": 3 * CPUS_PER_RANK}
    assert warm["held"] == held
    assert warm["groups"] == [{"state": "CREATED", "bundles": [held], "nodes": [seen["node"]]}]
    assert warm["groups_after"] == []
    ranks = {int(rank): pid for rank, pid in warm["ranks"].items()}
    before = {int(pid): ids for pid, ids in warm["before"].items()}
    after = {int(pid): ids for pid, ids in warm["after"].items()}
    spare = warm["spare_pid"]
    # Before the fault: rank 0, rank 1 and the spare each see one device of the three, none shared.
    assert set(before) == {ranks[0], ranks[1], spare}
    assert sorted(before.values()) == ["0", "1", "2"]
    # The spare became rank 1, the same process on the device it built its model on.
    assert warm["adopted_rank"] == 1 and spare not in ranks.values()
    (refill,) = set(after) - set(before)
    assert after[refill] == before[ranks[1]]  # the killed rank's device, freed
    live = {ranks[0]: before[ranks[0]], spare: before[spare], refill: after[refill]}
    assert sorted(live.values()) == ["0", "1", "2"]  # no two live processes share one
    # A fourth process on the node's three devices: refused, saying who holds them.
    assert "no device for a warm spare" in warm["refused"]
    assert all(f"by pid {pid}" in warm["refused"] for pid in live)
