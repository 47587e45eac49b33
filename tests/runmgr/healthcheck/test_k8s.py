"""--k8s-label against a local fake of the Kubernetes API: excluded nodes get
our label and annotations (why, which check, the fleet's figures), and our
NoSchedule taint only with --k8s-taint (others' taints kept); nodes that pass
again are cleared; --readmit clears marks by hand; nothing else is touched."""

from __future__ import annotations

import json
import os
from pathlib import Path

from runmgr.healthcheck.k8s import (
    BASELINE_ANNOTATION, CHECK_ANNOTATION, HEALTH_LABEL, REASON_ANNOTATION, TAINT_KEY, apply_health_labels,
    clear_mark, core_api, mark_excluded, readmit, refusal_line,
)
from tests import cli
from tests.runmgr.healthcheck.fake_k8s import FakeKubernetes

ROOT = Path(__file__).resolve().parents[3]

GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}


def entry(node_id: str, verdict: str, reasons=(), **k8s) -> dict:
    return {"node": node_id, "display": node_id, "verdict": verdict, "reasons": list(reasons),
            "ray": {"hostname": k8s.pop("hostname", "host-" + node_id)},
            "k8s": {"node_name": k8s.get("node_name"), "pod": k8s.get("pod"),
                    "namespace": k8s.get("namespace")}}


def test_with_taint_excluded_nodes_are_labelled_and_tainted_and_healed_ones_cleared():
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
        actions = apply_health_labels(report, core_api(fake.url), said.append, taint=True)
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


def test_health_check_fails_when_the_api_refused_every_call(local_ray, tmp_path):
    # Before: the check printed its table and exited 0, and no node was marked.
    # The check joins this process's Ray (its one node: the Kubernetes node by its host name)
    # instead of starting one of its own: what is checked here is what happens after the probes.
    address = local_ray.get_runtime_context().gcs_address
    with FakeKubernetes({}, refuse=403) as fake:
        # Small probes: what is checked here is what happens after them.
        result = cli.runmgr("health-check", f"cluster.address={address}", "cluster.cpus_per_worker=1",
                            "health.compute.matmul_size=256", "health.compute.bandwidth_mb=8",
                            "health.compute.repeats=1", f"run.dir={tmp_path / 'run'}",
                            "--k8s-label", "--k8s-host", fake.url, cwd=tmp_path, timeout=180,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})  # Ray's auth mode: this process's
        assert fake.requests and not [r for r in fake.requests if r["method"] == "PATCH"]
    assert result.returncode == 3, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("runmgr: error:")]
    assert len(errors) == 1 and "refused every node update(s)" in errors[0] and "403" in errors[0]
    assert "Traceback" not in result.stderr
    assert "NODE" in result.stdout  # the check itself is still shown


OURS = {"key": TAINT_KEY, "value": "excluded", "effect": "NoSchedule"}
FLEET = {"figures": {"compute.matmul_tflops": {"median": 310.0, "sigma": 2.0, "hosts": 6}},
         "software": {"torch": "2.13.0"}, "nodes": 6, "hosts": 6}


def test_by_default_an_excluded_node_is_labelled_and_annotated_not_tainted():
    """The manifests keep runmgr's pods off the label (nodeAffinity NotIn excluded): the
    default leaves other teams' pods free to use the node."""
    report = {"check_id": "c7", "baseline": FLEET, "nodes": [
        {**entry("r1", "exclude", ["compute.matmul_tflops 199.5 is 35% below the fleet median 310 (6 nodes)"],
                 node_name="gpu-07"),
         "report": {"node": "r1", "findings": [], "figures": {"compute.matmul_tflops": 199.5}, "facts": {}}}]}
    with FakeKubernetes({"gpu-07": {"metadata": {"labels": {"zone": "a"}}, "spec": {"taints": [GPU_TAINT]}}}) as fake:
        (action,) = apply_health_labels(report, core_api(fake.url), lambda line: None)
        node = fake.nodes["gpu-07"]
        (patch,) = fake.patches()
    assert action.action == "excluded"
    assert node["metadata"]["labels"] == {"zone": "a", HEALTH_LABEL: "excluded"}
    assert node["spec"]["taints"] == [GPU_TAINT]  # no taint of ours, the GPU pool's kept
    assert "spec" not in patch["body"]  # the taints list is not even sent
    annotations = node["metadata"]["annotations"]
    assert annotations[REASON_ANNOTATION].startswith("compute.matmul_tflops 199.5 is 35% below")
    assert annotations[CHECK_ANNOTATION] == "c7"
    assert json.loads(annotations[BASELINE_ANNOTATION]) == {**FLEET, "check": "c7", "needs_peers": []}


def test_a_node_excluded_for_its_collectives_is_kept_out_of_a_check_alone():
    reason = "all-reduce with healthy r2 reaches 0.5 GB/s, below 8 (fleet 10): the node's network or PCIe is slow"
    report = {"check_id": "c8", "baseline": FLEET, "nodes": [
        {**entry("r1", "exclude", [reason], node_name="gpu-07"),
         "report": {"node": "r1", "findings": [{"severity": "fail", "code": "collectives.slow_node",
                                                "message": reason}], "figures": {}, "facts": {}}}]}
    with FakeKubernetes({"gpu-07": {}}) as fake:
        apply_health_labels(report, core_api(fake.url), lambda line: None)
        baseline = json.loads(fake.nodes["gpu-07"]["metadata"]["annotations"][BASELINE_ANNOTATION])
    assert baseline["needs_peers"] == [reason]


def test_readmit_clears_only_our_marks_and_says_what_each_node_had():
    marked = {"metadata": {"labels": {HEALTH_LABEL: "excluded", "zone": "a"},
                           "annotations": {REASON_ANNOTATION: "ECC", CHECK_ANNOTATION: "c1",
                                           BASELINE_ANNOTATION: "{}", "owner": "team-b"}},
              "spec": {"taints": [GPU_TAINT, OURS]}}
    labelled = {"metadata": {"labels": {HEALTH_LABEL: "excluded"}, "annotations": {REASON_ANNOTATION: "slow"}}}
    with FakeKubernetes({"gpu-07": marked, "gpu-08": labelled, "gpu-09": {"spec": {"taints": [GPU_TAINT]}}}) as fake:
        done = readmit(core_api(fake.url), ["gpu-07", "gpu-08", "gpu-09", "gpu-99"])
        gpu07, gpu08, gpu09 = (fake.nodes[n] for n in ("gpu-07", "gpu-08", "gpu-09"))
        patched = sorted(r["path"].rsplit("/", 1)[-1] for r in fake.patches())
    assert [(d.node, d.outcome, d.removed) for d in done] == [
        ("gpu-07", "readmitted", ("label", "taint", "annotations")),
        ("gpu-08", "readmitted", ("label", "annotations")),
        ("gpu-09", "no marks", ()), ("gpu-99", "not found", ())]
    assert patched == ["gpu-07", "gpu-08"]
    assert gpu07["metadata"]["labels"] == {"zone": "a"} and gpu07["spec"]["taints"] == [GPU_TAINT]
    assert gpu07["metadata"]["annotations"] == {"owner": "team-b"}
    assert gpu08["metadata"]["labels"] == {} and not gpu08["spec"].get("taints")
    assert gpu09["spec"]["taints"] == [GPU_TAINT]


def test_the_lead_s_call_labels_only_and_clear_mark_undoes_it():
    """The driver's mid-run exclusion: mark_excluded(api, node, reasons, check_id)."""
    with FakeKubernetes({"gpu-07": {"spec": {"taints": [GPU_TAINT]}}}) as fake:
        api = core_api(fake.url)
        mark_excluded(api, "gpu-07", ("rank 3 hung",), "run-12")
        assert fake.nodes["gpu-07"]["metadata"]["labels"] == {HEALTH_LABEL: "excluded"}
        assert fake.nodes["gpu-07"]["spec"]["taints"] == [GPU_TAINT]
        mark_excluded(api, "gpu-07", ("rank 3 hung",), "run-12", taint=True)
        assert fake.nodes["gpu-07"]["spec"]["taints"] == [GPU_TAINT, OURS]
        assert clear_mark(api, "gpu-07") is True and clear_mark(api, "gpu-07") is False
        assert fake.nodes["gpu-07"]["spec"]["taints"] == [GPU_TAINT]
        assert fake.nodes["gpu-07"]["metadata"]["labels"] == {}


def test_a_node_holding_an_excluded_pod_stays_marked_beside_an_admitted_one():
    report = {"check_id": "c9", "nodes": [entry("r1", "exclude", ["GPU 3: Xid 79"], node_name="gpu-07"),
                                          entry("r2", "admit", node_name="gpu-07")]}
    with FakeKubernetes({"gpu-07": {}}) as fake:
        actions = apply_health_labels(report, core_api(fake.url), lambda line: None)
        assert fake.nodes["gpu-07"]["metadata"]["labels"] == {HEALTH_LABEL: "excluded"}
    assert [a.action for a in actions] == ["excluded", "unchanged"]
