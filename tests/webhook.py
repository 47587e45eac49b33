"""A real webhook receiver on 127.0.0.1 for tests: it records every POST's JSON body and answers
with the status codes it is told to (500 for the first few, say), then 200."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

import pytest


class Receiver:
    """The server, what it received, and the answers it still has to give before 200s."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        self.failures_first: list[int] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with receiver.lock:
                    code = receiver.failures_first.pop(0) if receiver.failures_first else 200
                    if code == 200:
                        receiver.bodies.append(json.loads(body))
                        receiver.paths.append(self.path)
                        receiver.arrived.notify_all()
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook/secret-token"
        # shutdown() returns once serve_forever looks again: every 0.05 s, not its default 0.5 s
        # (half a second of waiting at every test's end, for nothing).
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()

    def wait_for(self, count: int, timeout: float = 60.0) -> list[dict]:
        """The bodies once ``count`` have arrived (the bound is for a sender that never sends)."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.bodies) >= count, timeout=timeout)
            return list(self.bodies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    served = Receiver()
    try:
        yield served
    finally:
        served.close()
