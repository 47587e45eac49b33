"""--k8s-label against a local fake of the Kubernetes API: excluded nodes get
our label, reason annotation and NoSchedule taint (others' taints kept);
nodes that pass again are cleared; nothing else is touched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from runmgr.healthcheck.k8s import (
    HEALTH_LABEL, REASON_ANNOTATION, TAINT_KEY, apply_health_labels, core_api, refusal_line,
)
from tests.runmgr.healthcheck.fake_k8s import FakeKubernetes

ROOT = Path(__file__).resolve().parents[3]
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def entry(node_id: str, verdict: str, reasons=(), **k8s) -> dict:
    return {"node": node_id, "display": node_id, "verdict": verdict, "reasons": list(reasons),
            "ray": {"hostname": k8s.pop("hostname", "host-" + node_id)},
            "k8s": {"node_name": k8s.get("node_name"), "pod": k8s.get("pod"),
                    "namespace": k8s.get("namespace")}}


def test_excluded_nodes_are_labelled_and_tainted_and_healed_ones_cleared():
    nodes = {"gpu-07": {"spec": {"taints": [GPU_TAINT]}},
             "gpu-08": {"metadata": {"labels": {HEALTH_LABEL: "excluded", "zone": "a"},
                                     "annotations": {REASON_ANNOTATION: "old"}},
                        "spec": {"taints": [{"key": TAINT_KEY, "value": "excluded", "effect": "NoSchedule"}]}},
             "gpu-09": {}, "gpu-10": {}}
    report = {"check_id": "20260101T000000Z-1", "nodes": [
        entry("r1", "exclude", ["NPU 1: 2 uncorrectable (double-bit) ECC errors"], node_name="gpu-07"),
        entry("r2", "admit", node_name="gpu-08"),
        entry("r3", "warn", hostname="gpu-09"),
        entry("r4", "exclude", ["/mnt/hpfs: ENOENT"], pod="ray-worker-x", namespace="train")]}
    said = []
    with FakeKubernetes(nodes, pods={("train", "ray-worker-x"): "gpu-10"}) as fake:
        actions = apply_health_labels(report, core_api(fake.url), said.append)
        patched = {r["path"].rsplit("/", 1)[-1]: r for r in fake.patches()}
        assert sorted(patched) == ["gpu-07", "gpu-08", "gpu-10"]  # gpu-09 had no marks
        assert all(r["content_type"] == "application/merge-patch+json" for r in patched.values())

        gpu07 = fake.nodes["gpu-07"]
        assert gpu07["metadata"]["labels"] == {HEALTH_LABEL: "excluded"}
        assert "double-bit" in gpu07["metadata"]["annotations"][REASON_ANNOTATION]
        assert gpu07["spec"]["taints"] == [GPU_TAINT, {"key": TAINT_KEY, "value": "excluded",
                                                       "effect": "NoSchedule"}]
        assert fake.nodes["gpu-10"]["metadata"]["labels"] == {HEALTH_LABEL: "excluded"}

        gpu08 = fake.nodes["gpu-08"]
        assert gpu08["metadata"]["labels"] == {"zone": "a"}
        assert REASON_ANNOTATION not in gpu08["metadata"].get("annotations", {})
        assert not gpu08["spec"].get("taints")
    assert [(a.k8s_node, a.action) for a in actions] == [
        ("gpu-07", "excluded"), ("gpu-10", "excluded"), ("gpu-08", "cleared"), ("gpu-09", "unchanged")]
    assert len(said) == 3


def test_an_unknown_node_is_reported_not_raised():
    report = {"check_id": "c", "nodes": [entry("r1", "exclude", ["slow"], node_name="gone-01")]}
    with FakeKubernetes({}) as fake:
        actions = apply_health_labels(report, core_api(fake.url), lambda line: None)
    assert actions[0].action == "failed" and "404" in actions[0].error


def test_refusals_make_one_line_and_none_when_all_went_through():
    report = {"check_id": "c", "nodes": [entry("r1", "exclude", ["slow"], node_name="gpu-01"),
                                         entry("r2", "admit", node_name="gpu-02")]}
    with FakeKubernetes({"gpu-01": {}, "gpu-02": {}}, refuse=403) as fake:
        actions = apply_health_labels(report, core_api(fake.url), lambda line: None)
    line = refusal_line(actions)
    assert line.startswith("--k8s-label: the Kubernetes API refused every node update(s) (first: node gpu-01: 403")
    assert "may get and patch nodes" in line and "\n" not in line
    with FakeKubernetes({"gpu-01": {}, "gpu-02": {}}) as fake:
        assert refusal_line(apply_health_labels(report, core_api(fake.url), lambda line: None)) is None


def test_health_check_fails_when_the_api_refused_every_call(tmp_path):
    # Before: the check printed its table and exited 0, and no node was marked.
    with FakeKubernetes({}, refuse=403) as fake:
        result = subprocess.run([sys.executable, "-m", "runmgr", "health-check", "cluster.local_nodes=1",
                                 "--k8s-label", "--k8s-host", fake.url],
                                cwd=tmp_path, capture_output=True, text=True, timeout=180,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert fake.requests and not [r for r in fake.requests if r["method"] == "PATCH"]
    assert result.returncode == 3, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("runmgr: error:")]
    assert len(errors) == 1 and "refused every node update(s)" in errors[0] and "403" in errors[0]
    assert "Traceback" not in result.stderr
    assert "NODE" in result.stdout  # the check itself is still shown
