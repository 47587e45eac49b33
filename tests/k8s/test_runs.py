"""One run per name: a run is a small kustomization of an overlay with its
own name suffix and label (k8s/runs/NAME/kustomization.yaml, as the README
and docs/kubernetes.md write it), and two runs applied to one namespace do
not collide. Rendered offline as ``kubectl apply -k`` would send them.

No object is shared between runs, cluster-scoped ones included: each run has
its own ClusterRole and ClusterRoleBinding (same rights), so that
``kubectl delete -k`` of one run leaves the other's rights alone. The only
thing the runs of a namespace share is what the user creates there: the
namespace itself and the S3 Secret runmgr-s3."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from tests.k8s.crd_schema import crd_errors
from tests.k8s.manifests import (K8S, OVERLAYS, ROOT, RUN_KUSTOMIZATION, of_kind, one, pod_templates,
                                 ray_cluster, render_run)
from tests.k8s.test_validate import builtin_errors, is_ray

RUN_LABEL = "runmgr.io/run"
DOCS = ROOT / "docs" / "kubernetes.md"
USER_MADE = {("Secret", "runmgr-s3")}
"""Objects the user creates in the namespace (README), which every run there may name."""


def key(doc: dict) -> tuple[str, str | None, str]:
    return doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"]


def references(template: dict) -> set[tuple[str, str]]:
    """(kind, name) of every object a pod template names."""
    spec = template["spec"]
    found = {("ServiceAccount", spec["serviceAccountName"])}
    for v in spec.get("volumes", []):
        if "configMap" in v:
            found.add(("ConfigMap", v["configMap"]["name"]))
        if "persistentVolumeClaim" in v:
            found.add(("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"]))
        if "secret" in v:
            found.add(("Secret", v["secret"]["secretName"]))
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        for source in c.get("envFrom", []):
            if "configMapRef" in source:
                found.add(("ConfigMap", source["configMapRef"]["name"]))
            if "secretRef" in source:
                found.add(("Secret", source["secretRef"]["name"]))
    return found


def selected(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """overlay -> (run alpha's documents, run beta's documents), both of that overlay."""
    root = tmp_path_factory.mktemp("runs")
    return {overlay: (render_run(root / overlay, "alpha", overlay), render_run(root / overlay, "beta", overlay))
            for overlay in OVERLAYS}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_two_runs_share_no_object(overlay, two_runs):
    alpha, beta = two_runs[overlay]
    counts = Counter(key(doc) for doc in (*alpha, *beta))
    assert [k for k, n in counts.items() if n > 1] == []
    assert {doc["metadata"].get("namespace") for doc in (*alpha, *beta)} <= {"runmgr", None}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_run_s_pods_name_only_their_own_objects(overlay, two_runs):
    """ConfigMaps, the claim and the service account in the RayJob's pod
    templates are its own run's (kustomize rewrote them with the suffix)."""
    for name, docs, other in (("alpha", *two_runs[overlay]), ("beta", *reversed(two_runs[overlay]))):
        job = one(docs, "RayJob")
        assert job["metadata"]["name"] == f"runmgr-{name}"
        own = {(d["kind"], d["metadata"]["name"]) for d in docs}
        theirs = {(d["kind"], d["metadata"]["name"]) for d in other}
        for group, template in pod_templates(job).items():
            named = references(template) - USER_MADE
            assert named and named <= own, (group, sorted(named - own))
            assert not named & theirs, group
            assert template["metadata"]["labels"][RUN_LABEL] == name, group
        assert {d["metadata"]["labels"].get(RUN_LABEL) for d in docs} == {name}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_metrics_service_selects_only_its_own_run_s_head(overlay, two_runs):
    alpha, beta = two_runs[overlay]
    templates = {(run, group): t for run, docs in (("alpha", alpha), ("beta", beta))
                 for group, t in pod_templates(one(docs, "RayJob")).items()}
    for run, docs in (("alpha", alpha), ("beta", beta)):
        (service,) = of_kind(docs, "Service")
        chosen = [where for where, t in templates.items() if selected(service["spec"]["selector"], t["metadata"]["labels"])]
        assert chosen == [(run, "head")], service["metadata"]["name"]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_run_s_rights_go_to_its_own_service_account(overlay, two_runs):
    for docs in two_runs[overlay]:
        (account,) = of_kind(docs, "ServiceAccount")
        roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("Role", "ClusterRole")}
        bindings = of_kind(docs, "RoleBinding") + of_kind(docs, "ClusterRoleBinding")
        assert len(bindings) == len(roles) == 2
        for binding in bindings:
            assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles
            assert [(s["kind"], s["name"], s.get("namespace", binding["metadata"].get("namespace")))
                    for s in binding["subjects"]] == \
                [("ServiceAccount", account["metadata"]["name"], account["metadata"]["namespace"])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_run_validates_like_its_overlay(overlay, two_runs):
    alpha, _ = two_runs[overlay]
    job = one(alpha, "RayJob")
    assert crd_errors(job) == [] and crd_errors(ray_cluster(job)) == []
    assert [line for doc in alpha if not is_ray(doc) for line in builtin_errors(doc)] == []


def test_a_run_s_own_config_replaces_the_overlay_s(tmp_path):
    """A run edits its copy of the overlay's run.yaml (its own run.name, data,
    arguments) and names it in its kustomization: the run's ConfigMap holds it."""
    run_dir = tmp_path / "k8s" / "runs" / "gamma"
    run_dir.mkdir(parents=True)
    (run_dir / "run.yaml").write_text("run:\n  name: gamma\n")
    text = RUN_KUSTOMIZATION.format(name="gamma", overlay="megatron-gpu") + (
        "configMapGenerator:\n  - name: runmgr-job\n    behavior: merge\n    files:\n      - k8s.yaml=run.yaml\n")
    docs = render_run(tmp_path, "gamma", "megatron-gpu", text)
    data = one(docs, "ConfigMap", "runmgr-job-gamma")["data"]
    assert yaml.safe_load(data["k8s.yaml"]) == {"run": {"name": "gamma"}} and "job.sh" in data
    assert Path(run_dir / "kustomization.yaml").is_file()


def docs_yaml_blocks() -> list[str]:
    return re.findall(r"```yaml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.S)


def test_the_docs_run_kustomization_renders(tmp_path):
    """docs/kubernetes.md's run kustomization, NAME filled in, with its run.yaml beside it."""
    (block,) = [b for b in docs_yaml_blocks() if b.startswith("# k8s/runs/NAME/kustomization.yaml")]
    run_yaml = (K8S / "overlays" / "megatron-gpu" / "run.yaml").read_text()
    docs = render_run(tmp_path, "delta", "megatron-gpu", block.replace("NAME", "delta"), {"run.yaml": run_yaml})
    assert one(docs, "RayJob")["metadata"]["name"] == "runmgr-delta"
    assert yaml.safe_load(one(docs, "ConfigMap", "runmgr-job-delta")["data"]["k8s.yaml"]) == yaml.safe_load(run_yaml)


@pytest.mark.parametrize("what, overlay", [("nodeSelector", "megatron-gpu"), ("replicas, value: 65", "megatron-gpu"),
                                           ("hccn-conf", "mindspeed-npu")])
def test_the_docs_patches_do_what_they_say(what, overlay, tmp_path):
    """Each patch docs/kubernetes.md shows, added to a run: it renders, validates,
    and has its effect on the RayJob."""
    (block,) = [b for b in docs_yaml_blocks() if b.startswith("patches:") and what in b]
    text = RUN_KUSTOMIZATION.format(name="epsilon", overlay=overlay) + block
    docs = render_run(tmp_path, "epsilon", overlay, text)
    job = one(docs, "RayJob")
    assert crd_errors(job) == [] and crd_errors(ray_cluster(job)) == []
    assert [line for doc in docs if not is_ray(doc) for line in builtin_errors(doc)] == []
    head, worker = job["spec"]["rayClusterSpec"]["headGroupSpec"], job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    if what == "nodeSelector":
        assert head["template"]["spec"]["nodeSelector"] == {"node-pool": "cpu"}
    elif what.startswith("replicas"):
        assert worker["replicas"] == worker["minReplicas"] == worker["maxReplicas"] == 65
    else:
        (mount,) = [m for m in worker["template"]["spec"]["containers"][0]["volumeMounts"] if m["name"] == "hccn-conf"]
        assert mount == {"name": "hccn-conf", "mountPath": "/etc/hccn.conf", "readOnly": True}
