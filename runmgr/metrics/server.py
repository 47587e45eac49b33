"""The driver's ``/metrics`` endpoint: prometheus_client's WSGI app over a
registry that belongs to this run (no process-wide singleton), served by the
standard library's threading WSGI server as prometheus_client's
``start_http_server`` serves it, and bound before anything of the run starts
so that an address it cannot take is one line and exit code 2."""

from __future__ import annotations

import socket
import threading
from socketserver import ThreadingMixIn
from typing import Optional
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from runmgr.config.metrics import MetricsConfig, split_address
from runmgr.errors import ConfigError

SHUTDOWN_POLL_S = 0.1
"""How often the serving loop looks for :meth:`MetricsServer.close`'s request. ``start_http_server``
serves with http.server's default 0.5 s, so every launch's and follower's end waited up to half a
second (0.25 s on average) for its metrics server to stop."""


class QuietHandler(WSGIRequestHandler):
    """A scrape is not worth a line on the run's console."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
        pass


class ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape; a scrape in flight never holds the driver's exit."""

    daemon_threads = True


def serve(host: str, port: int, registry: CollectorRegistry) -> tuple[WSGIServer, threading.Thread]:
    """``registry`` served on ``host:port`` (IPv4 or IPv6, as the host resolves) from a daemon
    thread; OSError when the address cannot be taken."""
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    server_class = type("MetricsHTTPServer", (ThreadingServer,), {"address_family": family})
    httpd = make_server(sockaddr[0], port, make_wsgi_app(registry), server_class, handler_class=QuietHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": SHUTDOWN_POLL_S},
                              name="metrics-http", daemon=True)
    thread.start()
    return httpd, thread


def format_address(host: str, port: int) -> str:
    """``host:port``, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class MetricsServer:
    """A run's registry, served over HTTP until :meth:`close`."""

    def __init__(self, registry: CollectorRegistry, httpd, thread) -> None:
        self.registry = registry
        self._httpd = httpd
        self._thread = thread

    @classmethod
    def start(cls, config: MetricsConfig) -> Optional["MetricsServer"]:
        """Listen on ``config.address`` (None when metrics are off); ConfigError
        in one line when the address cannot be bound."""
        if not config.enabled:
            return None
        host, port = split_address(config.address)  # checked with the config: well formed
        registry = CollectorRegistry(auto_describe=False)
        try:
            httpd, thread = serve(host, port, registry)
        except OSError as exc:  # a port in use or not ours to take, a host that does not resolve here
            reason = exc.strerror or str(exc)
            raise ConfigError(f"metrics.address {config.address!r}: cannot listen there ({reason}); choose a free "
                              f"port, or port 0 to take any (metrics.address=127.0.0.1:0)") from None
        return cls(registry, httpd, thread)

    @property
    def address(self) -> str:
        """Where it listens, with the port really taken (``127.0.0.1:41235``)."""
        host, port = self._httpd.server_address[:2]
        return format_address(host, port)

    def close(self) -> None:
        """Stop serving and free the port."""
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

