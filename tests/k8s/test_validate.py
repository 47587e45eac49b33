"""Every overlay of k8s/ renders with ``kubectl kustomize`` and validates
offline: built-in kinds with kubernetes-validate (strict: an unknown field is
an error), the RayJob and the RayCluster it creates against KubeRay's CRD
schemas. No document escapes both; a misspelt field fails. No overlay needs
an operator beyond KubeRay (the ServiceMonitor is an optional component,
k8s/components/servicemonitor, tested there)."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from tests.k8s.crd_schema import CRD_FILES, crd_errors
from tests.k8s.manifests import (KUBERNETES_VERSION, OVERLAYS, containers, one, pod_templates, ray_cluster,
                                 rayjob, render)

RAY_GROUP = "ray.io"
EXPECTED_KINDS = {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
                  "Service", "RayJob"}


def builtin_errors(doc: dict) -> list[str]:
    """kubernetes-validate --strict on one document (empty: valid)."""
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as error:
        where = ".".join(str(p) for p in error.path) or "(top)"
        return [f"{doc['kind']} {doc['metadata']['name']}: {where}: {error.message}"]
    return []


def is_builtin(doc: dict) -> bool:
    """A kind kubernetes-validate holds a schema of for this Kubernetes version."""
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.SchemaNotFoundError:
        return False
    except kubernetes_validate.ValidationError:
        return True
    return True


def is_ray(doc: dict) -> bool:
    return doc["apiVersion"].split("/")[0] == RAY_GROUP


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlay_renders_the_run_s_objects(overlay):
    kinds = {doc["kind"] for doc in render(overlay)}
    assert EXPECTED_KINDS <= kinds, EXPECTED_KINDS - kinds


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlay_applies_without_any_operator_but_kuberay(overlay):
    """A cluster without prometheus-operator (or any other operator) accepts
    every document: each is a built-in kind or KubeRay's. The Namespace is
    the user's (`kubectl create namespace`), never the overlay's: deleting one
    run must not delete the namespace other runs share."""
    groups = {doc["apiVersion"].rpartition("/")[0] for doc in render(overlay)}
    assert groups <= {"", "rbac.authorization.k8s.io", RAY_GROUP}, groups
    assert "Namespace" not in {doc["kind"] for doc in render(overlay)}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_built_in_kinds_pass_kubernetes_validate_strict(overlay):
    docs = [doc for doc in render(overlay) if not is_ray(doc)]
    assert docs
    errors = [line for doc in docs for line in builtin_errors(doc)]
    assert errors == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rayjob_and_its_raycluster_match_the_kuberay_crds(overlay):
    job = rayjob(render(overlay))
    assert crd_errors(job) == []
    assert crd_errors(ray_cluster(job)) == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_document_escapes_validation(overlay):
    """Each document is a built-in kind or a KubeRay kind, both checked above:
    a new kind needs a schema before it ships."""
    unchecked = [f"{doc['apiVersion']} {doc['kind']}" for doc in render(overlay)
                 if not (is_builtin(doc) or (is_ray(doc) and (RAY_GROUP, doc["kind"]) in CRD_FILES))]
    assert unchecked == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_metrics_service_reaches_the_driver_s_port(overlay):
    """The Service selects the head pod (where the RayJob's driver runs) and
    targets the container port its metrics are served on."""
    docs = render(overlay)
    service = one(docs, "Service", "runmgr-metrics")
    assert {"app.kubernetes.io/name": "runmgr", "app.kubernetes.io/component": "metrics"}.items() \
        <= service["metadata"]["labels"].items()
    templates = pod_templates(rayjob(docs))
    selected = [group for group, t in templates.items()
                if service["spec"]["selector"].items() <= t["metadata"]["labels"].items()]
    assert selected == ["head"]
    head_ports = {p["name"]: p["containerPort"] for c in containers(templates["head"]) for p in c.get("ports", [])}
    (port,) = service["spec"]["ports"]
    assert head_ports[port["targetPort"]] == port["port"] == 8000


def test_an_unknown_field_fails_validation():
    docs = render("gpu")
    job = copy.deepcopy(rayjob(docs))
    job["spec"]["shutdownAfterJobFinish"] = True  # misspelt: KubeRay would silently keep the cluster
    worker = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    worker["template"]["spec"]["containers"][0]["resource"] = {"limits": {"nvidia.com/gpu": "8"}}
    errors = "\n".join(crd_errors(job))
    assert "'shutdownAfterJobFinish' was unexpected" in errors and "'resource' was unexpected" in errors

    service = copy.deepcopy(one(docs, "Service", "runmgr-metrics"))
    service["spec"]["ports"][0]["targetport"] = "runmgr-metrics"
    (error,) = builtin_errors(service)
    assert "spec.ports.0" in error and "targetport" in error
