"""A local HTTP fake of the few Kubernetes API endpoints the labeller uses
(GET/PATCH /api/v1/nodes/NAME, GET /api/v1/namespaces/NS/pods/NAME). It keeps
node objects, applies JSON merge patches (RFC 7386) as the API server does,
and records every request so that tests can assert the calls."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class FakeKubernetes:
    """Start with ``with FakeKubernetes(nodes) as api: ... api.url``."""

    def __init__(self, nodes: dict[str, dict] | None = None, pods: dict[tuple[str, str], str] | None = None,
                 refuse: int | None = None):
        """``refuse``: answer every call with this status (403: RBAC forbids it)."""
        self.nodes = {name: {"apiVersion": "v1", "kind": "Node",
                             "metadata": {"name": name, "labels": {}, "resourceVersion": "1", **meta},
                             "spec": spec}
                      for name, (meta, spec) in ((n, (v.get("metadata", {}), v.get("spec", {})))
                                                 for n, v in (nodes or {}).items())}
        self.pods = pods or {}
        self.refuse = refuse
        self.requests: list[dict] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def patches(self) -> list[dict]:
        return [r for r in self.requests if r["method"] == "PATCH"]

    def __enter__(self) -> "FakeKubernetes":
        # shutdown() at the block's end returns once serve_forever looks again: every 0.05 s, not 0.5 s.
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _not_found(self) -> None:
                self._reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": "NotFound", "code": 404, "message": f"{self.path} not found"})

            def _refused(self) -> None:
                self._reply(fake.refuse, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                          "reason": "Forbidden", "code": fake.refuse, "message": "refused"})

            def do_GET(self) -> None:
                fake.requests.append({"method": "GET", "path": self.path})
                if fake.refuse:
                    return self._refused()
                parts = self.path.split("?")[0].strip("/").split("/")
                if parts[:3] == ["api", "v1", "nodes"] and len(parts) == 4 and parts[3] in fake.nodes:
                    return self._reply(200, fake.nodes[parts[3]])
                if parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 6 and parts[4] == "pods":
                    node = fake.pods.get((parts[3], parts[5]))
                    if node:
                        return self._reply(200, {"apiVersion": "v1", "kind": "Pod",
                                                 "metadata": {"name": parts[5], "namespace": parts[3]},
                                                 "spec": {"nodeName": node, "containers": []}})
                self._not_found()

            def do_PATCH(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                name = self.path.split("?")[0].strip("/").split("/")[-1]
                fake.requests.append({"method": "PATCH", "path": self.path, "body": body,
                                      "content_type": self.headers.get("Content-Type")})
                if fake.refuse:
                    return self._refused()
                if name not in fake.nodes:
                    return self._not_found()
                node = fake.nodes[name]
                expected = body.get("metadata", {}).get("resourceVersion")
                if expected is not None and expected != node["metadata"]["resourceVersion"]:
                    return self._reply(409, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                             "reason": "Conflict", "code": 409, "message": "modified"})
                updated = merge_patch(node, body)
                updated["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)
                fake.nodes[name] = updated
                self._reply(200, updated)

        return Handler
