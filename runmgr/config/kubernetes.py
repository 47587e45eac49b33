"""The driver's side of a run on KubeRay: replacing an excluded node's worker pod
(runmgr/kuberay.py). The manifests (k8s/) set it; a local run leaves it off."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

NAMESPACE_ENV = "RUNMGR_K8S_NAMESPACE"
"""The driver pod's namespace (the head template's downward API: metadata.namespace)."""
RAY_CLUSTER_ENV = "RUNMGR_RAY_CLUSTER"
"""The driver pod's RayCluster (the downward API: metadata.labels['ray.io/cluster'])."""


@dataclass
class KubernetesConfig:
    """What the driver does with the Kubernetes API while a run is on KubeRay."""

    replace_excluded_nodes: bool = False
    """When a decision excludes a node, label its Kubernetes node (runmgr.io/health=excluded,
    which the manifests' affinity keeps pods off) and have KubeRay delete its worker pod
    through the RayCluster's ``workersToDelete``; KubeRay starts a new pod to keep the worker
    group's replicas, and the next sub-run runs at full size on it (or on a spare pod at
    once). Needs the driver inside the RayCluster (the RUNMGR_K8S_NAMESPACE and
    RUNMGR_RAY_CLUSTER variables the manifests set, or ``namespace`` and ``ray_cluster``)."""
    replacement_timeout_s: float = 900.0
    """How long the next sub-run waits for the replacement pod's room (image pull, Ray start);
    past it the sub-run starts with what is there, shrinking if the trainer can."""
    namespace: Optional[str] = None
    """The RayCluster's namespace; None reads RUNMGR_K8S_NAMESPACE."""
    ray_cluster: Optional[str] = None
    """The RayCluster's name; None reads RUNMGR_RAY_CLUSTER."""
    api_host: Optional[str] = None
    """The API server's URL; None: in-cluster (the pod's service account), else ~/.kube/config."""

    def resolved_namespace(self) -> Optional[str]:
        return self.namespace or os.environ.get(NAMESPACE_ENV) or None

    def resolved_ray_cluster(self) -> Optional[str]:
        return self.ray_cluster or os.environ.get(RAY_CLUSTER_ENV) or None

    def problems(self) -> list[str]:
        timeout = self.replacement_timeout_s
        if not (math.isfinite(timeout) and timeout > 0):
            return [f"kubernetes.replacement_timeout_s must be a number of seconds > 0, got {timeout}"]
        return []

    def launch_problems(self, cluster_address: Optional[str]) -> list[str]:
        """What keeps ``replace_excluded_nodes`` from being honoured on this launch."""
        if not self.replace_excluded_nodes:
            return []
        if not cluster_address:
            return ["kubernetes.replace_excluded_nodes=true needs the run on a KubeRay cluster "
                    "(cluster.address=auto inside it); a local Ray has no pods to replace: set it to false"]
        missing = [name for name, value in ((f"kubernetes.namespace or {NAMESPACE_ENV}", self.resolved_namespace()),
                                            (f"kubernetes.ray_cluster or {RAY_CLUSTER_ENV}",
                                             self.resolved_ray_cluster())) if not value]
        if missing:
            return [f"kubernetes.replace_excluded_nodes=true: {' and '.join(missing)} unset (the k8s/ manifests set "
                    f"the variables on the head pod): set them, or kubernetes.replace_excluded_nodes=false"]
        return []
