"""Label and taint the Kubernetes nodes of excluded Ray nodes, through the
official ``kubernetes`` client, so that the scheduler keeps new pods (the
next RayCluster, other jobs) off them; clear our marks from nodes that pass
again. Only our own label, annotations and taint are ever touched.

Which Kubernetes node a Ray node is: ``k8s.node_name`` from the probe (the
downward API's ``spec.nodeName`` in RUNMGR_K8S_NODE_NAME or NODE_NAME), else
the pod's node looked up by pod name and namespace, else the host name (a
kubelet's default node name).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

from runmgr.errors import UserError

HEALTH_LABEL = "runmgr.io/health"
REASON_ANNOTATION = "runmgr.io/health-reason"
CHECK_ANNOTATION = "runmgr.io/health-check"
TAINT_KEY = "runmgr.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
_MERGE_PATCH = "application/merge-patch+json"
_REASON_CHARS = 1000


class KubernetesError(UserError):
    """The Kubernetes API cannot be configured or reached; the message says how to fix it."""


@dataclass(frozen=True)
class LabelTarget:
    """A Ray node of the report, with what locates its Kubernetes node."""

    ray_node_id: str
    display: str
    hostname: str
    reasons: tuple[str, ...]
    k8s_node: Optional[str] = None
    pod: Optional[str] = None
    namespace: Optional[str] = None


@dataclass(frozen=True)
class LabelAction:
    """What was done to one Kubernetes node (``error`` set when it failed)."""

    ray_node_id: str
    k8s_node: Optional[str]
    action: str
    """``excluded`` (labelled and tainted), ``cleared`` (our marks removed), ``unchanged``."""
    error: Optional[str] = None

    def to_dict(self) -> dict:
        return {"ray_node_id": self.ray_node_id, "k8s_node": self.k8s_node,
                "action": self.action, "error": self.error}


def targets(report: Mapping) -> tuple[list[LabelTarget], list[LabelTarget]]:
    """(excluded, admitted) targets from a JSON report of summary.build_report."""
    excluded, admitted = [], []
    for entry in report.get("nodes", []):
        k8s = entry.get("k8s") or {}
        target = LabelTarget(entry["node"], entry.get("display", entry["node"]),
                             (entry.get("ray") or {}).get("hostname", ""), tuple(entry["reasons"]),
                             k8s.get("node_name"), k8s.get("pod"), k8s.get("namespace"))
        (excluded if entry["verdict"] == "exclude" else admitted).append(target)
    return excluded, admitted


def core_api(host: Optional[str] = None):
    """A CoreV1Api: at ``host`` (a URL), else in-cluster, else ~/.kube/config."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    if host:
        configuration = client.Configuration()
        configuration.host = host
        return client.CoreV1Api(client.ApiClient(configuration))
    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config()
        except (ConfigException, OSError) as exc:
            raise KubernetesError(
                f"no Kubernetes API to label nodes with ({exc}): run inside the cluster, set up "
                "~/.kube/config, or pass --k8s-host URL") from None
    return client.CoreV1Api()


def node_name_of(api, target: LabelTarget) -> str:
    if target.k8s_node:
        return target.k8s_node
    if target.pod and target.namespace:
        return api.read_namespaced_pod(target.pod, target.namespace).spec.node_name
    return target.hostname


def _taints(api, node) -> list[dict]:
    """The node's taints other than ours, as plain dicts."""
    serialize = api.api_client.sanitize_for_serialization
    return [serialize(t) for t in (node.spec.taints or []) if t.key != TAINT_KEY]


def mark_excluded(api, name: str, reasons: tuple[str, ...], check_id: str) -> None:
    """Label, annotate (why, which check) and taint NoSchedule one node.

    Taints are a list that a merge patch replaces whole, so the node is read
    first and the patch carries its resourceVersion: a concurrent change makes
    the API refuse the patch instead of losing someone else's taint.
    """
    node = api.read_node(name)
    taint = {"key": TAINT_KEY, "value": "excluded", "effect": TAINT_EFFECT}
    body = {"metadata": {"labels": {HEALTH_LABEL: "excluded"},
                         "annotations": {REASON_ANNOTATION: "; ".join(reasons)[:_REASON_CHARS],
                                         CHECK_ANNOTATION: check_id},
                         "resourceVersion": node.metadata.resource_version},
            "spec": {"taints": _taints(api, node) + [taint]}}
    api.patch_node(name, body, _content_type=_MERGE_PATCH)


def clear_mark(api, name: str) -> bool:
    """Remove our label, annotations and taint; False when the node had none."""
    node = api.read_node(name)
    ours = (node.metadata.labels or {}).get(HEALTH_LABEL) is not None or any(
        t.key == TAINT_KEY for t in (node.spec.taints or []))
    if not ours:
        return False
    body = {"metadata": {"labels": {HEALTH_LABEL: None},
                         "annotations": {REASON_ANNOTATION: None, CHECK_ANNOTATION: None},
                         "resourceVersion": node.metadata.resource_version},
            "spec": {"taints": _taints(api, node) or None}}
    api.patch_node(name, body, _content_type=_MERGE_PATCH)
    return True


def apply_health_labels(report: Mapping, api, progress: Callable[[str], None]) -> list[LabelAction]:
    """Mark the excluded nodes of ``report`` and clear the admitted ones."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    check_id = str(report.get("check_id", ""))
    excluded, admitted = targets(report)
    actions = []
    for target, exclude in [(t, True) for t in excluded] + [(t, False) for t in admitted]:
        name = None
        try:
            name = node_name_of(api, target)
            if exclude:
                mark_excluded(api, name, target.reasons, check_id)
                action = "excluded"
            else:
                action = "cleared" if clear_mark(api, name) else "unchanged"
            actions.append(LabelAction(target.ray_node_id, name, action))
        except (ApiException, HTTPError) as exc:
            error = f"{getattr(exc, 'status', '')} {getattr(exc, 'reason', '') or exc}".strip()
            actions.append(LabelAction(target.ray_node_id, name, "failed", error[:300]))
        last = actions[-1]
        if last.action != "unchanged":
            progress(f"k8s: node {last.k8s_node or target.display}: {last.action}"
                     + (f" ({last.error})" if last.error else ""))
    return actions


def refusal_line(actions: list[LabelAction]) -> Optional[str]:
    """One line when the API refused any call (None when all went through)."""
    failed = [a for a in actions if a.action == "failed"]
    if not failed:
        return None
    every = "every" if len(failed) == len(actions) else f"{len(failed)} of {len(actions)}"
    first = failed[0]
    return (f"--k8s-label: the Kubernetes API refused {every} node update(s) (first: node "
            f"{first.k8s_node or first.ray_node_id}: {first.error}); no label or taint was applied to "
            f"{'them' if len(failed) > 1 else 'it'}: check --k8s-host and that the service account may "
            f"get and patch nodes")
