"""The driver's ``/metrics`` endpoint: prometheus_client's own HTTP server
over a registry that belongs to this run (no process-wide singleton), bound
before anything of the run starts so that an address it cannot take is one
line and exit code 2."""

from __future__ import annotations

from typing import Optional

from prometheus_client import CollectorRegistry, start_http_server

from runmgr.config.metrics import MetricsConfig, split_address
from runmgr.errors import ConfigError


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
            httpd, thread = start_http_server(port, addr=host, registry=registry)
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

