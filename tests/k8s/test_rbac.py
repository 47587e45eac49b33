"""The RBAC of k8s/ grants the driver exactly what it needs, and every
Kubernetes API call runmgr's code makes is among it. The list (GRANTED):
nodes get/patch cluster-wide (labels: only a ClusterRole can grant nodes);
in the run's namespace only, pods get/list and rayclusters.ray.io get/patch
(an excluded node's worker pod handed back to KubeRay through
workersToDelete). The calls are derived from the code itself: every use of a
method of the official client's API classes (``read_node``, ``patch_node``,
``patch_namespaced_custom_object``, ...) anywhere under runmgr/, mapped
through the client's own request path and HTTP method to (API group,
resource, verb, scope); a custom object's group and resource are the KubeRay
ones the code names."""

from __future__ import annotations

import ast
import functools
import inspect
import re
from dataclasses import dataclass
from typing import Literal

import kubernetes.client
import pytest

from tests.k8s.manifests import OVERLAYS, ROOT, of_kind, one, pod_templates, rayjob, render

Scope = Literal["cluster", "namespace"]
SERVICE_ACCOUNT = "runmgr"
_REQUEST = re.compile(r"'(/apis?/[^']*)',\s*'(GET|POST|PUT|PATCH|DELETE)'")
KUBERAY_GROUP = "ray.io"
KUBERAY_PLURALS = {"rayclusters", "rayjobs", "rayservices"}
"""KubeRay's resources, as a custom-object call names them."""


@dataclass(frozen=True, order=True)
class Access:
    """One right: what RBAC calls (apiGroup, resource[/subresource], verb), and where."""

    group: str
    resource: str
    verb: str
    scope: Scope


@functools.lru_cache(maxsize=None)
def api_methods() -> dict[str, tuple[type, ...]]:
    """Method name -> the client's API classes (CoreV1Api, ...) that have it."""
    found: dict[str, list[type]] = {}
    for name, cls in vars(kubernetes.client).items():
        if isinstance(cls, type) and name.endswith("Api") and name != "ApiClient":
            for method in vars(cls):
                if not method.startswith("_") and not method.endswith("_with_http_info"):
                    found.setdefault(method, []).append(cls)
    return {method: tuple(classes) for method, classes in found.items()}


def names_in(package_dir) -> dict[str, list[str]]:
    """Every attribute and plain name used in the package -> where."""
    used: dict[str, list[str]] = {}
    for path in sorted(package_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name:
                used.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return used


def methods_used(package_dir) -> dict[str, list[str]]:
    """API methods named anywhere in the package (called, or passed to a
    watch) -> where."""
    return {name: where for name, where in names_in(package_dir).items() if name in api_methods()}


def classes_used(package_dir) -> set[str]:
    """The client's API classes the package names (CoreV1Api, ...)."""
    classes = {cls.__name__ for owners in api_methods().values() for cls in owners}
    return classes & set(names_in(package_dir))


def access_of(method: str, among: frozenset[str] = frozenset()) -> Access:
    """What the client's ``method`` requests, from its request path and HTTP
    method; ``among``: the API classes the code names, where several have it
    (``create_namespaced_event``: CoreV1Api and EventsV1Api)."""
    owners = api_methods()[method]
    chosen = [cls for cls in owners if cls.__name__ in among] if len(owners) > 1 else list(owners)
    assert len(chosen) == 1, f"{method}: which of {[c.__name__ for c in owners]} does the code call?"
    (cls,) = chosen
    source = inspect.getsource(getattr(cls, f"{method}_with_http_info"))
    (path, http), = _REQUEST.findall(source)
    parts = path.strip("/").split("/")
    group, rest = ("", parts[2:]) if parts[0] == "api" else (parts[1], parts[3:])
    scope: Scope = "cluster"
    if rest[:2] == ["namespaces", "{namespace}"]:
        scope, rest = "namespace", rest[2:]
    named = len(rest) > 1 and rest[1] == "{name}"
    resource = "/".join([rest[0], *rest[2:]])
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[http]
    return Access(group, resource, verb, scope)


GRANTED = {
    Access("", "nodes", "get", "cluster"), Access("", "nodes", "patch", "cluster"),
    Access("", "pods", "get", "namespace"), Access("", "pods", "list", "namespace"),
    Access(KUBERAY_GROUP, "rayclusters", "get", "namespace"), Access(KUBERAY_GROUP, "rayclusters", "patch", "namespace"),
}
"""What the driver's service account may do, and where (k8s/base/rbac.yaml says why each)."""


def strings_in(package_dir) -> set[str]:
    return {node.value for path in sorted(package_dir.rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path)))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)}


def custom_resources(package_dir) -> set[tuple[str, str]]:
    """(group, plural) of the custom resources the package names: KubeRay's."""
    return {(KUBERAY_GROUP, plural) for plural in strings_in(package_dir) & KUBERAY_PLURALS}


def needed() -> set[Access]:
    package = ROOT / "runmgr"
    among = frozenset(classes_used(package))
    found = set()
    for method in methods_used(package):
        access = access_of(method, among)
        if access.group != "{group}":
            found.add(access)
            continue
        resources = custom_resources(package)
        assert resources, f"{method}: which custom resource? the code names none of {sorted(KUBERAY_PLURALS)}"
        found |= {Access(group, access.resource.replace("{plural}", plural), access.verb, access.scope)
                  for group, plural in resources}
    return found


def expand(rules: list[dict], scope: Scope) -> set[Access]:
    granted = set()
    for rule in rules:
        assert not rule.get("resourceNames") and not rule.get("nonResourceURLs"), rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    assert "*" not in (group, resource, verb), f"wildcard in {rule}"
                    granted.add(Access(group, resource, verb, scope))
    return granted


def bound_to_runmgr(docs, binding_kind: str, role: dict) -> bool:
    bindings = [b for b in of_kind(docs, binding_kind) if b["roleRef"]["name"] == role["metadata"]["name"]
                and b["roleRef"]["kind"] == role["kind"]]
    subjects = [s for b in bindings for s in b["subjects"]]
    namespace = one(docs, "ServiceAccount", SERVICE_ACCOUNT)["metadata"]["namespace"]
    return bool(bindings) and all(
        (s["kind"], s["name"], s.get("namespace", bindings[0]["metadata"].get("namespace")))
        == ("ServiceAccount", SERVICE_ACCOUNT, namespace) for s in subjects)


def test_the_calls_are_derived_from_the_code():
    """The health check's node marking is found where it is written."""
    used = methods_used(ROOT / "runmgr")
    assert {"read_node", "patch_node", "read_namespaced_pod"} <= set(used)
    assert all(where.startswith("runmgr/healthcheck/k8s.py") for where in used["patch_node"])
    assert access_of("patch_node") == Access("", "nodes", "patch", "cluster")
    assert access_of("read_namespaced_pod") == Access("", "pods", "get", "namespace")
    assert access_of("list_namespaced_pod") == Access("", "pods", "list", "namespace")
    assert access_of("read_namespaced_pod_log") == Access("", "pods/log", "get", "namespace")
    assert access_of("patch_namespaced_deployment") == Access("apps", "deployments", "patch", "namespace")
    assert access_of("create_namespaced_event", frozenset({"EventsV1Api"})) \
        == Access("events.k8s.io", "events", "create", "namespace")
    assert access_of("patch_namespaced_custom_object") == Access("{group}", "{plural}", "patch", "namespace")
    assert access_of("get_namespaced_custom_object") == Access("{group}", "{plural}", "get", "namespace")
    assert classes_used(ROOT / "runmgr") <= {"CoreV1Api", "CustomObjectsApi"}


def granted(docs) -> set[Access]:
    return {a for r in of_kind(docs, "ClusterRole") for a in expand(r["rules"], "cluster")} \
        | {a for r in of_kind(docs, "Role") for a in expand(r["rules"], "namespace")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_rbac_grants_exactly_the_driver_s_rights(overlay):
    """Nodes cluster-wide; pods and rayclusters in the run's namespace only
    (a Role, never a ClusterRole), each bound to runmgr's service account."""
    docs = render(overlay)
    assert sorted(granted(docs)) == sorted(GRANTED)
    for role, binding_kind in [(r, "ClusterRoleBinding") for r in of_kind(docs, "ClusterRole")] \
            + [(r, "RoleBinding") for r in of_kind(docs, "Role")]:
        assert bound_to_runmgr(docs, binding_kind, role), role["metadata"]["name"]


def test_every_call_runmgr_makes_is_granted_and_almost_every_grant_is_used():
    """The code's calls are within the grants; every grant but listing pods
    (granted for finding a node's pod by label) is a call the code makes."""
    calls = needed()
    assert calls <= GRANTED, sorted(calls - GRANTED)
    assert GRANTED - calls <= {Access("", "pods", "list", "namespace")}, sorted(GRANTED - calls)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_of_the_cluster_runs_as_runmgr_s_service_account(overlay):
    """The head (driver, health check) and the workers hold the rights; the
    namespaced Role is in the namespace the pods run in."""
    docs = render(overlay)
    job = rayjob(docs)
    assert {group: t["spec"].get("serviceAccountName") for group, t in pod_templates(job).items()} \
        == {group: SERVICE_ACCOUNT for group in pod_templates(job)}
    assert {r["metadata"]["namespace"] for r in of_kind(docs, "Role")} == {job["metadata"]["namespace"]}
