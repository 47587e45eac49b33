"""On KubeRay the head is the driver's pod alone (num-cpus 0, no accelerator):
the health check judges only the nodes that can hold a rank. On a real local Ray
whose head holds no CPU (in a process of its own: driver_only_cluster.py),
`runmgr health-check` reports the two worker nodes and neither checks nor
excludes the head (which, compared with them, would stand out in every figure and
have its Kubernetes node labelled for nothing)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests import cli
from tests.runmgr.healthcheck.cluster_process import cluster_process

ROOT = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("driver_only_cluster.py")
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled"}
QUICK = ["health.compute.matmul_size=256", "health.compute.bandwidth_mb=8", "health.compute.repeats=1",
         "health.collectives.megabytes=1", "health.collectives.iterations=1"]
"""Small probes: this test checks which nodes are probed, not what they measure."""


@pytest.fixture(scope="module")
def cluster():
    with cluster_process(HELPER) as description:
        yield description


def test_rank_nodes_leaves_out_a_node_without_the_rank_s_resources(cluster):
    assert cluster["rank_nodes"]["one_cpu"] == cluster["workers"]
    assert cluster["rank_nodes"]["no_cpu"] == 3  # a rank that asks for no CPU fits anywhere, the head too


def test_only_the_nodes_that_can_hold_a_rank_are_checked(cluster, tmp_path):
    result = cli.runmgr("health-check", f"cluster.address={cluster['address']}", "cluster.cpus_per_worker=1",
                        f"run.dir={tmp_path / 'run'}", *QUICK, "--json", cwd=tmp_path, timeout=300, env=ENV)
    assert result.returncode in (0, 1) and result.stdout, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert sorted(entry["node"] for entry in report["nodes"]) == cluster["workers"]
    assert cluster["head"] not in report.get("excluded", {})


def test_a_cluster_whose_nodes_cannot_hold_a_megatron_node_is_refused_from_its_node_list(cluster, tmp_path):
    """`runmgr launch` on this cluster (moved here from tests/runmgr/test_launch_refusals.py, whose
    two-node Ray of its own it was the last user of): its CPUs in all hold the run's two ranks, but
    no node holds a Megatron node of two; the refusal comes from Ray's node list once connected (no
    placement is tried) and names the closest node, a 1-CPU worker, not the head's 0 CPUs."""
    run_dir = tmp_path / "run"
    result = cli.runmgr("launch", "conf=demo", f"run.dir={run_dir}", f"cluster.address={cluster['address']}",
                        "chaos=none", "health.skip=true", "trainer.kind=megatron", "megatron.nproc_per_node=2",
                        "cluster.cpus_per_worker=1", cwd=ROOT, timeout=300, env=ENV)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert result.stdout == ""  # nothing started
    line = lines[0]
    for text in (f"cannot run on the cluster in view, Ray cluster at {cluster['address']}: no node can hold one node "
                 "of megatron.nproc_per_node=2 ranks (CPU 2 on one node = 2 x cluster.cpus_per_worker 1): the "
                 "closest, ", "has CPU 1; set megatron.nproc_per_node=1, or lower cluster.cpus_per_worker / "
                 "cluster.devices_per_worker, or add nodes that have CPU 2"):
        assert text in line, line
    assert any(f"({worker[:12]})" in line for worker in cluster["workers"]), line  # a worker, by its id
    assert cluster["address"].split(":")[0] in line  # the node named by its address
    assert not run_dir.exists()
