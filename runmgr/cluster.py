"""Connecting to Ray: an existing cluster (``cluster.address``) or a local
one started for the run. An unreachable address is one clear line."""

from __future__ import annotations

import logging
import os
import socket

from runmgr.config.schema import ClusterConfig
from runmgr.errors import ClusterError

CONNECT_TIMEOUT_S = 5.0
# Ray kills a worker with SIGTERM and waits this long before SIGKILL; a hung
# (stopped) rank never acts on SIGTERM, so the default 5 s only delays restarts.
LOCAL_RAY_SYSTEM_CONFIG = {"kill_worker_timeout_milliseconds": 500}


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


def _ray_address_file() -> str:
    from ray._common.utils import get_ray_address_file  # the one place Ray keeps that path

    return get_ray_address_file(None)


def local_node_cpus(cluster: ClusterConfig) -> int:
    """CPUs each node of a several-node local Ray advertises: one rank's."""
    return max(1, int(cluster.cpus_per_worker + 0.999))


def local_ray_cpus(cluster: ClusterConfig) -> int:
    """CPUs the local Ray that :func:`connect` starts (cluster.address null)
    advertises in all: known before it starts, so a launch can be refused
    first. One node advertises at least what the ranks reserve, so ranks may
    share this machine's cores."""
    if cluster.local_nodes > 1:
        return cluster.local_nodes * local_node_cpus(cluster)
    needed = int(cluster.num_workers * cluster.cpus_per_worker + 0.999)
    return cluster.local_num_cpus or max(os.cpu_count() or 1, needed)


class LocalCluster:
    """Several Ray nodes on this machine (``cluster.local_nodes`` > 1), one rank
    each, so that a node can be excluded and its ranks moved to a spare."""

    def __init__(self, cluster: ClusterConfig) -> None:
        from ray.cluster_utils import Cluster

        node_args = {"num_cpus": local_node_cpus(cluster)}
        head_args = {**node_args, "include_dashboard": False, "_system_config": LOCAL_RAY_SYSTEM_CONFIG}
        self._cluster = Cluster(initialize_head=True, head_node_args=head_args)
        for _ in range(cluster.local_nodes - 1):
            self._cluster.add_node(**node_args)
        self.address = self._cluster.address
        # Cluster() records itself as "the current cluster" of this machine
        # (/tmp/ray/ray_current_cluster), which a plain ray.init() elsewhere would
        # then join: this cluster is the run's alone.
        address_file = _ray_address_file()
        if os.path.exists(address_file):
            os.remove(address_file)

    def shutdown(self) -> None:
        self._cluster.shutdown()


def connect(cluster: ClusterConfig) -> LocalCluster | None:
    """ray.init for the run; the caller passes what this returns (the local
    nodes it started, if any) to :func:`disconnect` at the end."""
    import ray

    if ray.is_initialized():
        return None
    kwargs: dict = {"logging_level": logging.ERROR, "log_to_driver": False}
    if cluster.address and cluster.address != "auto":
        check_reachable(cluster.address)
        ray.init(address=cluster.address, **kwargs)
        return None
    if cluster.address == "auto":
        ray.init(address="auto", **kwargs)
        return None
    if cluster.local_nodes > 1:
        local = LocalCluster(cluster)
        ray.init(address=local.address, **kwargs)
        return local
    num_cpus = local_ray_cpus(cluster)
    # address="local": always a new Ray of our own, never whatever cluster
    # /tmp/ray/ray_current_cluster points at.
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
             _system_config=LOCAL_RAY_SYSTEM_CONFIG, **kwargs)
    return None


def disconnect(local: LocalCluster | None = None) -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
    if local is not None:
        local.shutdown()
