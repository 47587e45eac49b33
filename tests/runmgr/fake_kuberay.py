"""A local HTTP fake of the Kubernetes API as a KubeRay cluster's driver sees it:
nodes (GET, merge PATCH with resourceVersion), pods (GET) and one RayCluster
(GET, merge PATCH with resourceVersion). A PATCH of the RayCluster is reconciled
the way KubeRay's operator does (raycluster_controller.go, reconcilePods): each
pod named in a worker group's ``scaleStrategy.workersToDelete`` is deleted
whatever the replica count, the list is cleared, and new pods are created to
keep ``replicas``, each on a node the pods' affinity admits (not labelled
runmgr.io/health=excluded) and no pod holds. Every request is recorded."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from runmgr.healthcheck.k8s import HEALTH_LABEL
from tests.runmgr.healthcheck.fake_k8s import merge_patch


class FakeKubeRay:
    """``with FakeKubeRay(nodes, workers) as api: ... api.url``: ``workers`` maps each
    worker group to its pods' nodes (the group's replicas: their number)."""

    def __init__(self, nodes: list[str], workers: dict[str, list[str]], namespace: str = "train",
                 cluster: str = "run12", refuse_raycluster: int | None = None) -> None:
        self.namespace, self.cluster = namespace, cluster
        self.refuse_raycluster = refuse_raycluster
        self.nodes = {name: {"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": name, "labels": {}, "resourceVersion": "1"}, "spec": {}}
                      for name in nodes}
        self._names = itertools.count()
        self.pods: dict[str, dict] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.raycluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
                           "metadata": {"name": cluster, "namespace": namespace, "resourceVersion": "1"},
                           "spec": {"headGroupSpec": {}, "workerGroupSpecs": [
                               {"groupName": group, "replicas": len(hosts), "minReplicas": len(hosts),
                                "maxReplicas": len(hosts), "template": {}} for group, hosts in workers.items()]}}
        for group, hosts in workers.items():
            for host in hosts:
                self._create(group, host)
        self.requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def pods_on(self) -> dict[str, str]:
        """Pod name -> node name, of the pods that exist."""
        return {name: pod["spec"]["nodeName"] for name, pod in self.pods.items()}

    def __enter__(self) -> "FakeKubeRay":
        # shutdown() at the block's end returns once serve_forever looks again: every 0.05 s, not 0.5 s.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _create(self, group: str, node: str) -> str:
        name = f"{self.cluster}-{group}-worker-{next(self._names)}"
        self.pods[name] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": self.namespace,
                                        "labels": {"ray.io/cluster": self.cluster, "ray.io/group": group,
                                                   "ray.io/node-type": "worker"}},
                           "spec": {"nodeName": node, "containers": []}}
        self.created.append(name)
        return name

    def _reconcile(self) -> None:
        """KubeRay's reconcilePods for the worker groups."""
        for spec in self.raycluster["spec"]["workerGroupSpecs"]:
            for name in (spec.get("scaleStrategy") or {}).get("workersToDelete") or []:
                if self.pods.pop(name, None) is not None:
                    self.deleted.append(name)
            spec.setdefault("scaleStrategy", {})["workersToDelete"] = []
            held = [p for p in self.pods.values() if p["metadata"]["labels"]["ray.io/group"] == spec["groupName"]]
            for _ in range(spec["replicas"] - len(held)):
                used = {p["spec"]["nodeName"] for p in self.pods.values()}
                free = [n for n, node in self.nodes.items()
                        if n not in used and node["metadata"]["labels"].get(HEALTH_LABEL) != "excluded"]
                if free:  # else the pod stays Pending: no node for it
                    self._create(spec["groupName"], free[0])

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str) -> None:
                self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason,
                                   "code": code, "message": f"{self.path}: {reason}"})

            def _target(self):
                """(kind, object) the path names; object None when absent."""
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4:
                    return "node", fake.nodes.get(parts[3])
                if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
                    return "pod", fake.pods.get(parts[5]) if parts[3] == fake.namespace else None
                if (parts[:3] == ["apis", "ray.io", "v1"] and len(parts) == 7 and parts[5] == "rayclusters"
                        and parts[3:5] == ["namespaces", fake.namespace] and parts[6] == fake.cluster):
                    return "raycluster", fake.raycluster
                return None, None

            def do_GET(self) -> None:
                fake.requests.append({"method": "GET", "path": self.path})
                kind, target = self._target()
                if kind == "raycluster" and fake.refuse_raycluster:
                    return self._status(fake.refuse_raycluster, "Forbidden")
                if target is None:
                    return self._status(404, "NotFound")
                self._reply(200, target)

            def do_PATCH(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                body = json.loads(raw)
                fake.requests.append({"method": "PATCH", "path": self.path, "body": json.loads(raw),  # as sent
                                      "content_type": self.headers.get("Content-Type")})
                kind, target = self._target()
                if kind == "raycluster" and fake.refuse_raycluster:
                    return self._status(fake.refuse_raycluster, "Forbidden")
                if kind not in ("node", "raycluster") or target is None:
                    return self._status(404, "NotFound")
                expected = body.get("metadata", {}).get("resourceVersion")
                if expected is not None and expected != target["metadata"]["resourceVersion"]:
                    return self._status(409, "Conflict")
                updated = merge_patch(target, body)
                updated["metadata"]["resourceVersion"] = str(int(target["metadata"]["resourceVersion"]) + 1)
                if kind == "node":
                    fake.nodes[updated["metadata"]["name"]] = updated
                else:
                    fake.raycluster = updated
                    fake._reconcile()
                self._reply(200, updated)

        return Handler
