"""Mark the Kubernetes nodes of excluded Ray nodes, through the official
``kubernetes`` client, and clear our marks from nodes that pass again (or that
a person readmits, :func:`readmit`). Only our own label, annotations and taint
are ever touched.

The marks: the label ``runmgr.io/health=excluded`` (runmgr's pods keep off it
through their node affinity, NotIn excluded), the annotations saying why, by
which check, and the fleet's figures then (``runmgr.io/health-baseline``, JSON:
what ``--recheck-self`` compares the node with alone); and, only when asked
(``--k8s-taint``), the taint ``runmgr.io/unhealthy:NoSchedule``, which keeps
every other team's pods off the node too.

Which Kubernetes node a Ray node is: ``k8s.node_name`` from the probe (the
downward API's ``spec.nodeName`` in RUNMGR_K8S_NODE_NAME or NODE_NAME), else
the pod's node looked up by pod name and namespace, else the host name (a
kubelet's default node name).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from runmgr.errors import UserError

HEALTH_LABEL = "runmgr.io/health"
REASON_ANNOTATION = "runmgr.io/health-reason"
CHECK_ANNOTATION = "runmgr.io/health-check"
BASELINE_ANNOTATION = "runmgr.io/health-baseline"
"""JSON: the fleet's median figures (and spread, majority software) when the node was
excluded, and what only peers can judge (health.fleet.fleet_baseline, decide_alone)."""
OUR_ANNOTATIONS = (REASON_ANNOTATION, CHECK_ANNOTATION, BASELINE_ANNOTATION)
TAINT_KEY = "runmgr.io/unhealthy"
TAINT_EFFECT = "NoSchedule"
_MERGE_PATCH = "application/merge-patch+json"
_REASON_CHARS = 1000
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
"""A Kubernetes node name: an RFC 1123 subdomain (lower case, digits, '-' and '.')."""


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
    """``excluded`` (labelled, annotated; tainted with --k8s-taint), ``cleared`` (our marks
    removed), ``unchanged``, ``failed``."""
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


def mark_excluded(api, name: str, reasons: Sequence[str], check_id: str, taint: bool = False,
                  baseline: Optional[Mapping[str, Any]] = None) -> None:
    """Label one node excluded and annotate why and by which check (and, given
    ``baseline``, the fleet's figures then); with ``taint`` also taint it NoSchedule.

    Labels and annotations are maps, which a merge patch changes key by key. Taints
    are a list that a merge patch replaces whole, so with ``taint`` the node is read
    first and the patch carries its resourceVersion: a concurrent change makes the
    API refuse the patch instead of losing someone else's taint. Without ``taint`` a
    taint put there before is left as it is (``clear_mark`` removes it).
    """
    annotations = {REASON_ANNOTATION: "; ".join(reasons)[:_REASON_CHARS], CHECK_ANNOTATION: check_id}
    if baseline is not None:
        annotations[BASELINE_ANNOTATION] = json.dumps(baseline, sort_keys=True, separators=(",", ":"))
    body: dict = {"metadata": {"labels": {HEALTH_LABEL: "excluded"}, "annotations": annotations}}
    if taint:
        node = api.read_node(name)
        body["metadata"]["resourceVersion"] = node.metadata.resource_version
        body["spec"] = {"taints": _taints(api, node) + [
            {"key": TAINT_KEY, "value": "excluded", "effect": TAINT_EFFECT}]}
    api.patch_node(name, body, _content_type=_MERGE_PATCH)


@dataclass(frozen=True)
class Marks:
    """What of ours a node carries."""

    label: Optional[str] = None
    tainted: bool = False
    annotations: Mapping[str, str] = field(default_factory=dict)

    def what(self) -> tuple[str, ...]:
        """Names of the marks present, for a person: ``label``, ``taint``, ``annotations``."""
        return tuple(name for name, present in (("label", self.label is not None), ("taint", self.tainted),
                                                ("annotations", bool(self.annotations))) if present)

    def baseline(self) -> Optional[dict]:
        """The fleet's figures kept at exclusion (None: none, or not JSON)."""
        try:
            value = json.loads((self.annotations or {}).get(BASELINE_ANNOTATION, ""))
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def marks_of(node) -> Marks:
    """Our marks on a node object read with ``read_node``."""
    annotations = node.metadata.annotations or {}
    return Marks((node.metadata.labels or {}).get(HEALTH_LABEL),
                 any(t.key == TAINT_KEY for t in (node.spec.taints or [])),
                 {k: annotations[k] for k in OUR_ANNOTATIONS if k in annotations})


def clear_marks(api, name: str) -> tuple[str, ...]:
    """Remove our label, annotations and taint; the marks removed (empty: none were there)."""
    node = api.read_node(name)
    removed = marks_of(node).what()
    if not removed:
        return ()
    body: dict = {"metadata": {"labels": {HEALTH_LABEL: None},
                               "annotations": {key: None for key in OUR_ANNOTATIONS}}}
    if "taint" in removed:
        body["metadata"]["resourceVersion"] = node.metadata.resource_version
        body["spec"] = {"taints": _taints(api, node) or None}
    api.patch_node(name, body, _content_type=_MERGE_PATCH)
    return removed


def clear_mark(api, name: str) -> bool:
    """Remove our label, annotations and taint; False when the node had none."""
    return bool(clear_marks(api, name))


def api_error_text(exc: BaseException) -> str:
    """An API error as a person reads it: ``403 Forbidden``, or the connection's error."""
    return f"{getattr(exc, 'status', '') or ''} {getattr(exc, 'reason', '') or exc}".strip()[:300]


def check_node_names(names: Sequence[str]) -> None:
    """Refuse (one line) what cannot be a Kubernetes node's name."""
    for name in names:
        if len(name) > 253 or not _NODE_NAME.fullmatch(name):
            raise UserError(f"--readmit: {name!r} is not a Kubernetes node name (lower-case letters, digits, "
                            "'-' and '.'; see `kubectl get nodes -L runmgr.io/health`)")


@dataclass(frozen=True)
class Readmission:
    """What ``--readmit`` did to one node."""

    node: str
    outcome: str
    """``readmitted`` (our marks removed), ``no marks``, ``not found``, ``failed`` (the API refused)."""
    removed: tuple[str, ...] = ()
    error: Optional[str] = None

    def to_dict(self) -> dict:
        return {"node": self.node, "outcome": self.outcome, "removed": list(self.removed), "error": self.error}


def readmit(api, names: Sequence[str]) -> list[Readmission]:
    """Clear our marks from each named node; an unknown node is ``not found``, not an error."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    done = []
    for name in names:
        try:
            removed = clear_marks(api, name)
            done.append(Readmission(name, "readmitted" if removed else "no marks", removed))
        except ApiException as exc:
            done.append(Readmission(name, "not found") if exc.status == 404
                        else Readmission(name, "failed", error=api_error_text(exc)))
        except HTTPError as exc:
            done.append(Readmission(name, "failed", error=api_error_text(exc)))
    return done


def readmit_refusal_line(done: Sequence[Readmission]) -> Optional[str]:
    """One line when the API refused any node (None when all went through)."""
    failed = [d for d in done if d.outcome == "failed"]
    if not failed:
        return None
    every = "every" if len(failed) == len(done) else f"{len(failed)} of {len(done)}"
    return (f"--readmit: the Kubernetes API refused {every} node update(s) (first: node {failed[0].node}: "
            f"{failed[0].error}); their marks are still there: check --k8s-host and that the account "
            "may get and patch nodes")


def node_baselines(report: Mapping) -> dict[str, dict]:
    """Ray node id -> the baseline annotation of each excluded node of ``report``:
    the fleet's figures, the check, and the node's reasons only peers can judge."""
    from health.fleet import peer_only_reasons
    from health.node import NodeReport

    fleet = report.get("baseline")
    if not isinstance(fleet, Mapping):
        return {}
    found = {}
    for entry in report.get("nodes", []):
        if entry.get("verdict") == "exclude":
            node = NodeReport.from_dict(entry["report"]) if entry.get("report") else NodeReport(entry["node"])
            found[entry["node"]] = {**fleet, "check": str(report.get("check_id", "")),
                                    "needs_peers": peer_only_reasons(node, entry.get("reasons", []))}
    return found


def apply_health_labels(report: Mapping, api, progress: Callable[[str], None],
                        taint: bool = False) -> list[LabelAction]:
    """Mark the excluded nodes of ``report`` (label and annotations, with the fleet's
    figures; with ``taint`` a NoSchedule taint too) and clear the admitted ones. A
    Kubernetes node holding an excluded Ray node stays marked, whatever other Ray
    nodes (pods) on it did."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    check_id = str(report.get("check_id", ""))
    excluded, admitted = targets(report)
    baselines = node_baselines(report)
    marks = f"labelled {HEALTH_LABEL}=excluded" + (f", tainted {TAINT_KEY}:{TAINT_EFFECT}" if taint else "")
    marked: set[str] = set()
    actions = []
    for target, exclude in [(t, True) for t in excluded] + [(t, False) for t in admitted]:
        name = None
        try:
            name = node_name_of(api, target)
            if exclude:
                mark_excluded(api, name, target.reasons, check_id, taint=taint,
                              baseline=baselines.get(target.ray_node_id))
                marked.add(name)
                action = "excluded"
            elif name in marked:
                action = "unchanged"
            else:
                action = "cleared" if clear_mark(api, name) else "unchanged"
            actions.append(LabelAction(target.ray_node_id, name, action))
        except (ApiException, HTTPError) as exc:
            actions.append(LabelAction(target.ray_node_id, name, "failed", api_error_text(exc)))
        last = actions[-1]
        if last.action != "unchanged":
            progress(f"k8s: node {last.k8s_node or target.display}: {last.action}"
                     + (f" ({marks})" if last.action == "excluded" else "")
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
            f"{first.k8s_node or first.ray_node_id}: {first.error}); no mark was applied to or cleared from "
            f"{'them' if len(failed) > 1 else 'it'}: check --k8s-host and that the service account may "
            f"get and patch nodes")
