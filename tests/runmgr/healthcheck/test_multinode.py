"""Issue 3, item 2, on a real multi-node Ray cluster on this machine
(``ray.cluster_utils.Cluster``: four raylets, each its own node): one node's
workers are capped to a twentieth of a CPU by a cgroup, and one node has three
faults of its own: its npu-smi reports a double-bit ECC error, its HPFS path is
missing, and it sees another torch version in its package metadata.
``runmgr health-check --json`` must exclude exactly those two, the broken one
for each of its three faults (a report's exclusion reasons are failures only:
each fault excludes by itself), and admit the other two; ``runmgr launch`` must
then run its workers on those two only.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from logbook import Logbook
from tests import cli, throttle
from tests.runmgr.healthcheck.cluster_process import cluster_process

ROOT = Path(__file__).resolve().parents[3]
HELPER = Path(__file__).with_name("broken_cluster.py")
TINY_RUN = ["training.train_iters=4", "checkpoint.save_interval=2", "model.num_layers=1",
            "model.hidden_size=64", "model.ffn_hidden_size=172", "model.seq_length=64",
            "model.max_position_embeddings=64", "training.micro_batch_size=2",
            "training.global_batch_size=4", "data.corpus_max_bytes=200000"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not throttle.available(), reason="needs a writable CPU cgroup (root)")]


@pytest.fixture
def cluster(tmp_path):
    """The broken cluster, in its own process; yields its description."""
    with cluster_process(HELPER, str(tmp_path)) as description:
        yield description


def runmgr(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    return cli.runmgr(*args, cwd=cwd, timeout=timeout, env={**os.environ, "RAY_AUTH_MODE": "disabled"})


def test_health_check_excludes_the_broken_and_the_slow_node_and_launch_uses_the_rest(cluster, tmp_path):
    ids, mount_spec = cluster["ids"], cluster["mount_spec"]
    common = [f"cluster.address={cluster['address']}", f"run.dir={tmp_path / 'run'}"]
    check = runmgr("health-check", *common, f"health.storage.mounts={mount_spec}",
                   # Four nodes share one disk and two cores. Their benchmarks take turns, but a
                   # node may still measure while another imports torch: compare the compute
                   # figures only, with a wide floor (the capped node is about 20x slower, 10x beside busy neighbours).
                   "health.fleet.higher_is_better=[compute.matmul_tflops,compute.memory_gbps]",
                   "health.fleet.lower_is_better=[]", "health.fleet.mad_k=2",
                   "health.fleet.exclude_relative=0.75", "health.fleet.warn_relative=0.4",
                   "health.compute.repeats=10",
                   # The capped node's probe worker alone takes about a minute to start at a
                   # twentieth of a CPU, its benchmark's worker another: 40 s is twice what the
                   # healthy nodes' probes take beside two busy loops, and the capped node is
                   # excluded as overloaded instead of measured (103 s of the suite before).
                   "health.node_timeout_s=40", "--json", cwd=tmp_path, timeout=540)
    assert check.returncode == 1, check.stderr[-3000:]  # 1: some node excluded
    report = json.loads(check.stdout)
    excluded = report["excluded"]
    by_role = {role: excluded.get(node_id, []) for role, node_id in ids.items()}
    roles = {node_id: role for role, node_id in ids.items()}
    # Every node's figures with its role, so that a node not excluded shows what it measured.
    measured = {roles.get(entry.get("node"), entry.get("node")): entry for entry in report.get("nodes", [])}
    detail = json.dumps({"excluded": by_role, "nodes": measured}, indent=1, default=str)[:8000]
    assert set(excluded) == {ids["broken"], ids["slow"]}, detail
    assert sorted(report["admitted_node_ids"]) == sorted([ids["head"], ids["spare"]]), detail
    # The broken node: excluded for each of its three faults, and for nothing else.
    faults = {"device": lambda r: "uncorrectable (double-bit) ECC" in r, "mount": lambda r: "hpfs/broken: ENOENT" in r,
              "torch": lambda r: "torch 2.12.0 differs" in r}
    by_fault = {fault: [r for r in by_role["broken"] if seen(r)] for fault, seen in faults.items()}
    assert all(by_fault.values()) and sum(map(len, by_fault.values())) == len(by_role["broken"]), detail
    assert len(by_fault["mount"]) == 1, detail
    # The capped node is excluded as slow: by its compute figures, or, when the cap makes its
    # probes outlast health.node_timeout_s (seen on a slower machine), as hung or overloaded.
    assert by_role["slow"] and all((r.startswith("compute.") and "below the fleet median" in r)
                                   or "did not finish within health.node_timeout_s" in r
                                   for r in by_role["slow"]), detail
    assert report["collectives"]["first"], "the two admitted nodes all-reduce as a pair"

    launch = runmgr("launch", "conf=demo", *common, "run.name=multinode", "health.skip=true", "chaos=none", *TINY_RUN,
                    cwd=ROOT, timeout=540)
    assert launch.returncode == 0, launch.stdout[-3000:] + launch.stderr[-3000:]
    with Logbook.open(tmp_path / "run", create=False) as book:
        health = book.lineage()[0].evidence["health"]
        started = [e["data"]["workers"] for e in book.events() if e.get("kind") == "workers_started"]
    assert health["skipped"] and set(health["excluded"]) == set(excluded)
    placed = [w["node"] for workers in started for w in workers]
    assert len(placed) == 2 and set(placed) <= {ids["head"], ids["spare"]}, placed
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    assert sorted(w["node"] for w in status["workers"]) == sorted(placed)
