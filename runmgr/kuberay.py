"""KubeRay's side of a node exclusion: the excluded node's Kubernetes node is
labelled (runmgr.io/health=excluded: the manifests' affinity keeps every new pod
off it), then its worker pod is named in its worker group's
``scaleStrategy.workersToDelete`` on the RayCluster. KubeRay deletes the pods
listed there whatever the replica count, clears the list, and starts new pods
to keep ``replicas``: the replacement comes up on another node and joins the
Ray cluster. The controller then waits for its room (``await_ranks``).

Only worker pods of the driver's own RayCluster are ever named; the head is
never touched. A refused call is a record that says why, never an exception:
the run goes on without the replacement.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

from runmgr.controller.replacement import ReplacementRequest, RoomWait
from runmgr.healthcheck.k8s import mark_excluded

RAY_CLUSTER_LABEL = "ray.io/cluster"
GROUP_LABEL = "ray.io/group"
NODE_TYPE_LABEL = "ray.io/node-type"
RAY = ("ray.io", "v1", "rayclusters")
_MERGE_PATCH = "application/merge-patch+json"
_CONFLICT_TRIES = 3
AWAIT_POLL_S = 5.0
"""How often the wait for a replacement's room looks at the cluster."""


class KubeRayReplacement:
    """Replaces excluded nodes' worker pods of one RayCluster (a NodeReplacement)."""

    def __init__(self, core, custom, namespace: str, ray_cluster: str,
                 pod_of: Callable[[str], Optional[str]], room: Callable[[Sequence[str]], int],
                 check_id: str, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, poll_s: float = AWAIT_POLL_S) -> None:
        """``core``/``custom``: the kubernetes client's CoreV1Api and CustomObjectsApi;
        ``pod_of(node)``: the pod a Ray node (as decisions name it) runs in, None if unknown;
        ``room(avoid)``: ranks the usable nodes outside ``avoid`` hold now; ``check_id``:
        what the node's annotation names as the exclusion's source."""
        self.core, self.custom = core, custom
        self.namespace, self.ray_cluster = namespace, ray_cluster
        self.pod_of, self.room = pod_of, room
        self.check_id = check_id
        self.clock, self.sleep, self.poll_s = clock, sleep, poll_s

    def replace(self, nodes: Sequence[str], reason: str) -> list[ReplacementRequest]:
        return [self._replace_one(node, reason) for node in nodes]

    def await_ranks(self, ranks: int, timeout_s: float, avoid: Sequence[str]) -> RoomWait:
        start = self.clock()
        held = self.room(avoid)
        while held < ranks and self.clock() - start < timeout_s:
            self.sleep(self.poll_s)
            held = self.room(avoid)
        return RoomWait(ranks, held, round(self.clock() - start, 1), held < ranks)

    def _replace_one(self, node: str, reason: str) -> ReplacementRequest:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        pod_name = self.pod_of(node)
        if pod_name is None:
            return ReplacementRequest(node, False, "not replaced: Ray knows no pod (host name) for it")
        try:
            pod = self.core.read_namespaced_pod(pod_name, self.namespace)
        except ApiException as exc:
            if exc.status == 404:
                return ReplacementRequest(node, False, f"pod {pod_name} is already gone: KubeRay starts a new "
                                                       f"one itself", pod_name)
            return ReplacementRequest(node, False, f"not replaced: reading pod {pod_name}: {_said(exc)}", pod_name)
        except HTTPError as exc:
            return ReplacementRequest(node, False, f"not replaced: the API did not answer ({exc})", pod_name)
        labels = pod.metadata.labels or {}
        k8s_node = pod.spec.node_name
        if labels.get(RAY_CLUSTER_LABEL) != self.ray_cluster or labels.get(NODE_TYPE_LABEL) != "worker":
            return ReplacementRequest(node, False, (
                f"not replaced: pod {pod_name} is not a worker of RayCluster {self.ray_cluster} "
                f"({NODE_TYPE_LABEL}={labels.get(NODE_TYPE_LABEL)}, {RAY_CLUSTER_LABEL}="
                f"{labels.get(RAY_CLUSTER_LABEL)})"), pod_name, k8s_node)
        try:
            # The label first: without it the new pod could land on the same bad machine.
            mark_excluded(self.core, k8s_node, (reason,), self.check_id)
            group = self._delete_through_raycluster(pod_name, labels.get(GROUP_LABEL, ""))
        except (ApiException, HTTPError) as exc:
            return ReplacementRequest(node, False, f"not replaced: {_said(exc)} (check that the service account "
                                                   f"may patch nodes and rayclusters)", pod_name, k8s_node)
        except LookupError as exc:
            return ReplacementRequest(node, False, f"not replaced: {exc}", pod_name, k8s_node)
        return ReplacementRequest(node, True, (
            f"Kubernetes node {k8s_node} labelled excluded; pod {pod_name} named in workersToDelete of worker "
            f"group {group} of RayCluster {self.namespace}/{self.ray_cluster}: KubeRay starts its replacement"),
            pod_name, k8s_node)

    def _delete_through_raycluster(self, pod: str, group: str) -> str:
        """Add ``pod`` to its worker group's workersToDelete (the whole list goes in a merge patch,
        with the resourceVersion read: a concurrent change is retried, never overwritten)."""
        from kubernetes.client.exceptions import ApiException

        for attempt in range(_CONFLICT_TRIES):
            cluster = self.custom.get_namespaced_custom_object(*RAY[:2], self.namespace, RAY[2], self.ray_cluster)
            groups = cluster["spec"].get("workerGroupSpecs", [])
            index = next((i for i, g in enumerate(groups) if g.get("groupName") == group), None)
            if index is None:
                raise LookupError(f"RayCluster {self.ray_cluster} has no worker group {group!r} (pod {pod})")
            strategy = dict(groups[index].get("scaleStrategy") or {})
            strategy["workersToDelete"] = [*[p for p in strategy.get("workersToDelete") or [] if p != pod], pod]
            groups = [*groups[:index], {**groups[index], "scaleStrategy": strategy}, *groups[index + 1:]]
            body = {"metadata": {"resourceVersion": cluster["metadata"]["resourceVersion"]},
                    "spec": {"workerGroupSpecs": groups}}
            try:
                self.custom.patch_namespaced_custom_object(*RAY[:2], self.namespace, RAY[2], self.ray_cluster, body,
                                                           _content_type=_MERGE_PATCH)
                return group
            except ApiException as exc:
                if exc.status != 409 or attempt == _CONFLICT_TRIES - 1:
                    raise
        raise AssertionError("unreachable")


def _said(exc) -> str:
    return f"{getattr(exc, 'status', '')} {getattr(exc, 'reason', '') or exc}".strip()[:300]


def apis(host: Optional[str]):
    """(CoreV1Api, CustomObjectsApi) at ``host``, else in-cluster, else ~/.kube/config."""
    from kubernetes import client

    from runmgr.healthcheck.k8s import core_api

    core = core_api(host)
    return core, client.CustomObjectsApi(core.api_client)
