"""Connecting to Ray: an existing cluster (``cluster.address``) or a local
one started for the run. An unreachable address is one clear line."""

from __future__ import annotations

import logging
import os
import socket

from runmgr.config.schema import ClusterConfig
from runmgr.errors import ClusterError

CONNECT_TIMEOUT_S = 5.0


def parse_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"cluster.address {address!r} is not host:port (e.g. 10.0.0.1:6379), 'auto', or null for a local Ray")
    return host.strip("[]"), int(port)


def check_reachable(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast with one line instead of Ray's long retry loop."""
    host, port = parse_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ClusterError(
            f"cannot reach the Ray cluster at {address} ({reason}): start it with `ray start --head --port={port}` "
            f"there, fix cluster.address, or set cluster.address=null for a local Ray"
        ) from None


def preflight(cluster: ClusterConfig) -> None:
    """Cheap checks that need no Ray: the address is well formed and answers."""
    if cluster.address and cluster.address != "auto":
        check_reachable(cluster.address)


def connect(cluster: ClusterConfig) -> None:
    """ray.init for the run; the caller calls :func:`disconnect` at the end."""
    import ray

    if ray.is_initialized():
        return
    kwargs: dict = {"logging_level": logging.ERROR, "log_to_driver": False, "include_dashboard": False}
    if cluster.address and cluster.address != "auto":
        check_reachable(cluster.address)
        ray.init(address=cluster.address, **{k: v for k, v in kwargs.items() if k != "include_dashboard"})
        return
    if cluster.address == "auto":
        ray.init(address="auto", **{k: v for k, v in kwargs.items() if k != "include_dashboard"})
        return
    needed = int(cluster.num_workers * cluster.cpus_per_worker + 0.999)
    num_cpus = cluster.local_num_cpus or max(os.cpu_count() or 1, needed)
    ray.init(num_cpus=num_cpus, **kwargs)


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
