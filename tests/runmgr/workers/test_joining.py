"""A node that joins the run's Ray cluster after the launch's health check (KubeRay's
replacement for an excluded node's pod), on a real local Ray of several raylets
(ray.cluster_utils, in a process of its own: joining_cluster.py): it is probed
alone first; when it passes it joins the run's admitted nodes and its room counts,
when it fails it stays out with its reason. The decisions' node names map to the
Ray nodes' host names (a pod's name on KubeRay). A node admitted so holds no rank of the
sub-run that runs: the device poll reads it mid-run all the same, and an ECC error there
is an incident naming it, which the policy excludes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("joining_cluster.py")


@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    """What joining_cluster.py saw (one real local Ray for the module's tests)."""
    result = subprocess.run([sys.executable, str(HELPER), str(tmp_path_factory.mktemp("joining"))], cwd=ROOT,
                            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_a_node_that_joins_is_probed_alone_and_admitted_or_turned_away(seen):

    missing = seen["missing"]  # the new node lacks the mount: not counted, with its reason
    assert missing["after"] == missing["before"] == missing["admitted"]
    (reasons,) = missing["turned_away"]
    assert any("no-such-mount" in reason for reason in reasons), reasons

    healthy = seen["healthy"]
    assert healthy["after"] == healthy["before"] + 1
    assert len(healthy["admitted"]) == len(set(healthy["admitted"])) == healthy["before"] + 1  # the list placed on
    assert [line for line in healthy["said"] if "joined and was admitted" in line]
    assert healthy["polled"] == healthy["admitted"][-1:]  # the device poll takes the new node in
    assert seen["pod_of_first"] == seen["hostname"]  # Ray's host name: a pod's name on KubeRay
    assert seen["pod_of_unknown"] is None


def test_an_admitted_node_that_holds_no_rank_is_read_mid_run_and_its_ecc_error_excludes_it(seen):
    # The sub-run's one rank has its agent on the head, which reads its node itself. The node that
    # joined holds no rank: a poller of its own reads it, from the placement on.
    rankless = seen["rankless"]
    assert rankless["polled_before_placement"] == []
    assert rankless["polled"] == seen["healthy"]["admitted"][-1:]
    # Only the node no agent holds is read by the poll (the head's readings go with its agent's reports).
    assert rankless["read_nodes"] == [rankless["joined"]]
    # Its healthy readings first, then chaos's ECC error there: one incident naming it, and it goes.
    assert rankless["incidents"] == [[rankless["joined"]]]
    assert rankless["decisions"] == [["exclude_node", [rankless["joined"]]]]
