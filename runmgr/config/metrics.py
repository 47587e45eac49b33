"""The driver's Prometheus exporter, mirrored by ``conf/metrics/default.yaml``
(the metrics themselves: docs/metrics.md)."""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_ADDRESS = "127.0.0.1:0"


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for an IPv6 host) as (host, port); ValueError
    with what is wrong otherwise. The host is not resolved here: binding does it."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port:
        raise ValueError("expected host:port")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError("write an IPv6 host in brackets, e.g. [::1]:8000")
    if not host or any(c.isspace() or c in "[]/" for c in host):
        raise ValueError(f"{host!r} is not a host name or address")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"port {port!r} is not a number from 0 to 65535")
    return host, int(port)


@dataclass
class MetricsConfig:
    """Where the driver serves the run's metrics to Prometheus while it runs."""

    enabled: bool = True
    """Serve ``/metrics`` over HTTP from the driver (``runmgr launch``); false serves nothing."""
    address: str = DEFAULT_ADDRESS
    """``host:port`` to listen on. Port 0 takes a free port; the one taken is in
    ``runmgr status --json`` (``metrics.address``). 127.0.0.1 keeps it on this
    machine; the Kubernetes overlays listen on 0.0.0.0:8000 for Prometheus (k8s/components/servicemonitor).
    An address that cannot be bound (a port in use, an unknown host) refuses the launch."""

    def problems(self) -> list[str]:
        try:
            split_address(self.address)
        except ValueError as exc:
            return [f"metrics.address {self.address!r}: {exc} (e.g. {DEFAULT_ADDRESS} for a free port on this "
                    f"machine, 0.0.0.0:8000 for every interface)"]
        return []
