"""Exclusions a person can see and undo (issue 27), against a local fake of the
Kubernetes API: ``runmgr health-check --readmit NODE ...`` clears runmgr's marks
(and only runmgr's) and the stored exclusions ``runmgr launch`` honours, probing
nothing; ``--recheck-self`` checks an excluded machine alone against the fleet's
figures kept on its node, and clears its marks only when it passes."""

from __future__ import annotations

import json
import os
from pathlib import Path

from runmgr.healthcheck.exclusions import CheckRecord, ExclusionStore, NodeRecord
from runmgr.healthcheck.k8s import (
    BASELINE_ANNOTATION, CHECK_ANNOTATION, HEALTH_LABEL, REASON_ANNOTATION, TAINT_KEY,
)
from tests import cli
from tests.runmgr.healthcheck.fake_k8s import FakeKubernetes

ROOT = Path(__file__).resolve().parents[3]
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OUR_TAINT = {"key": TAINT_KEY, "value": "excluded", "effect": "NoSchedule"}
QUICK = ["health.compute.matmul_size=256", "health.compute.bandwidth_mb=8", "health.storage.probe_mb=1",
         "health.storage.latency_ops=2"]
"""Small probes (as tests/runmgr/healthcheck/test_gate.py's): what these tests check is not a figure's size."""


def runmgr(*args: str, cwd: Path, **env: str):
    return cli.runmgr(*args, cwd=cwd, timeout=540,
                      env={**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "disabled", **env})


def excluded_node(reason: str = "NPU 1: 2 uncorrectable (double-bit) ECC errors") -> dict:
    return {"metadata": {"labels": {HEALTH_LABEL: "excluded", "zone": "a"},
                         "annotations": {REASON_ANNOTATION: reason, CHECK_ANNOTATION: "c1",
                                         BASELINE_ANNOTATION: "{}", "team-b/owner": "x"}},
            "spec": {"taints": [GPU_TAINT, OUR_TAINT]}}


def stored_exclusions(tmp_path: Path) -> ExclusionStore:
    """What a check on KubeRay pods stored: gpu-07's pod and gpu-08's pod excluded."""
    store = ExclusionStore.for_runs_root(tmp_path / "runs")  # the demo config's runs root, from tmp_path
    store.record(CheckRecord("c1", 1.0, "health-check", (
        NodeRecord("aa", "host:runmgr-gpu-worker-x1", "runmgr-gpu-worker-x1 aa", "exclude", ("ECC",), "gpu-07"),
        NodeRecord("bb", "host:runmgr-gpu-worker-x2", "runmgr-gpu-worker-x2 bb", "exclude", ("slow",), "gpu-08"),
        NodeRecord("cc", "host:runmgr-gpu-worker-x3", "runmgr-gpu-worker-x3 cc", "admit", (), "gpu-09"))))
    return store


def test_readmit_clears_our_marks_and_the_stored_exclusion_one_line_per_node(tmp_path):
    store = stored_exclusions(tmp_path)
    with FakeKubernetes({"gpu-07": excluded_node(), "gpu-08": excluded_node("slow"),
                         "gpu-09": {"spec": {"taints": [GPU_TAINT]}}}) as fake:
        result = runmgr("health-check", "--readmit", "gpu-07", "gpu-09", "gpu-99", "--k8s-host", fake.url,
                        cwd=tmp_path)
        gpu07, gpu08 = fake.nodes["gpu-07"], fake.nodes["gpu-08"]
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3, result.stdout
    assert lines[0].startswith("gpu-07: readmitted: removed its label runmgr.io/health, taint "
                               "runmgr.io/unhealthy, annotations; cleared 1 stored exclusion(s)")
    assert lines[1].startswith("gpu-09: had no marks")
    assert lines[2] == "gpu-99: not found: no Kubernetes node of that name"
    # Only runmgr's marks went; the pool's taint, the zone label and team b's annotation stay.
    assert gpu07["metadata"]["labels"] == {"zone": "a"}
    assert gpu07["spec"]["taints"] == [GPU_TAINT]
    assert gpu07["metadata"]["annotations"] == {"team-b/owner": "x"}
    assert gpu08["metadata"]["labels"][HEALTH_LABEL] == "excluded"  # not named: untouched
    # runmgr launch (health.skip=true) no longer keeps gpu-07's pod out; gpu-08's still is.
    assert sorted(r.k8s_node for r in store.current_exclusions().values()) == ["gpu-08"]
    assert [c.source for c in store.checks()] == ["health-check", "readmit"]
    assert "connecting" not in result.stderr and "probing" not in result.stderr  # no Ray, no probe


def test_readmit_refused_by_the_api_is_exit_3_and_one_line(tmp_path):
    store = stored_exclusions(tmp_path)
    with FakeKubernetes({"gpu-07": excluded_node()}, refuse=403) as fake:
        result = runmgr("health-check", "--readmit", "gpu-07", "--k8s-host", fake.url, cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    errors = result.stderr.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith(
        "runmgr: error: --readmit: the Kubernetes API refused every node update(s) (first: node gpu-07: 403")
    assert "Traceback" not in result.stderr
    assert result.stdout.startswith("gpu-07: failed: 403")
    assert sorted(r.k8s_node for r in store.current_exclusions().values()) == ["gpu-07", "gpu-08"]  # kept


def test_an_excluded_machine_rechecked_alone_is_readmitted_only_when_it_passes(tmp_path):
    """The DaemonSet's story on one machine: excluded (a mount missing), re-checked while it
    is still slower than the fleet was, re-checked once it is as fast: readmitted."""
    mount = tmp_path / "hpfs"
    spec = (f"health.storage.mounts=[{{path: '{mount}', min_free_gb: 0, min_write_mbps: 0, min_read_mbps: 0, "
            "max_latency_ms: 100000}]")
    with FakeKubernetes({"gpu-07": {"metadata": {"labels": {"zone": "a"}}, "spec": {"taints": [GPU_TAINT]}}}) as fake:
        node = fake.nodes["gpu-07"]
        check = runmgr("health-check", "cluster.local_nodes=1", spec, *QUICK, "--k8s-label", "--k8s-host", fake.url,
                       "--json", cwd=tmp_path, RUNMGR_K8S_NODE_NAME="gpu-07")
        assert check.returncode == 1, check.stderr[-3000:]
        node = fake.nodes["gpu-07"]
        assert node["metadata"]["labels"] == {"zone": "a", HEALTH_LABEL: "excluded"}
        assert node["spec"]["taints"] == [GPU_TAINT]  # label only: no --k8s-taint
        annotations = node["metadata"]["annotations"]
        assert f"{mount}" in annotations[REASON_ANNOTATION]
        baseline = json.loads(annotations[BASELINE_ANNOTATION])
        assert baseline["check"] == json.loads(check.stdout)["check_id"] == annotations[CHECK_ANNOTATION]
        assert baseline["nodes"] == 1 and baseline["figures"] == {}  # one node: no fleet figure to keep

        # Repaired mount, but the fleet it was excluded from was far faster (say a slow GPU):
        # judged alone against that baseline, it stays out, and says why.
        mount.mkdir()
        slow_fleet = {**baseline, "check": "c-fleet", "hosts": 8,
                      "figures": {"compute.matmul_tflops": {"median": 1000.0, "sigma": 1.0, "hosts": 8}}}
        annotations[BASELINE_ANNOTATION] = json.dumps(slow_fleet)
        node["spec"]["taints"].append(OUR_TAINT)  # as an earlier --k8s-taint left it
        still = runmgr("health-check", spec, *QUICK, "--recheck-self", "--k8s-label", "--k8s-host", fake.url,
                       cwd=tmp_path, RUNMGR_K8S_NODE_NAME="gpu-07")
        assert still.returncode == 1, still.stderr[-3000:]
        assert "1 node(s) checked" in still.stdout  # alone, though the demo config has three local nodes
        assert "recheck: node gpu-07 still fails: compute.matmul_tflops" in still.stdout
        node = fake.nodes["gpu-07"]
        assert node["metadata"]["labels"][HEALTH_LABEL] == "excluded" and OUR_TAINT in node["spec"]["taints"]
        reason = node["metadata"]["annotations"][REASON_ANNOTATION]
        assert "below the fleet median 1000 kept when it was excluded (c-fleet)" in reason
        assert json.loads(node["metadata"]["annotations"][BASELINE_ANNOTATION]) == slow_fleet  # kept as it was

        # As fast as the fleet was: every mark of runmgr's goes, the pool's taint stays.
        node["metadata"]["annotations"][BASELINE_ANNOTATION] = json.dumps(
            {**slow_fleet, "figures": {"compute.matmul_tflops": {"median": 1e-6, "sigma": 0.0, "hosts": 8}}})
        passed = runmgr("health-check", spec, *QUICK, "--recheck-self", "--k8s-label", "--k8s-host", fake.url,
                        cwd=tmp_path, RUNMGR_K8S_NODE_NAME="gpu-07")
        node = fake.nodes["gpu-07"]
    assert passed.returncode == 0, passed.stderr[-3000:]
    assert "recheck: node gpu-07 passed" in passed.stdout
    assert "k8s: node gpu-07: readmitted: removed its label runmgr.io/health, taint runmgr.io/unhealthy, " \
           "annotations" in passed.stderr
    assert node["metadata"]["labels"] == {"zone": "a"} and node["spec"]["taints"] == [GPU_TAINT]
    assert not node["metadata"].get("annotations")
    # The first check's stored exclusion of this node is admitted: launch uses it again.
    assert ExclusionStore.for_runs_root(tmp_path / "runs").current_exclusions() == {}
