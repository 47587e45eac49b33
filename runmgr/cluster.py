"""Connecting to Ray: an existing cluster (``cluster.address``) or a local
one started for the run. An unreachable address is one clear line."""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from runmgr.config.schema import ClusterConfig
from runmgr.errors import ClusterError

CONNECT_TIMEOUT_S = 5.0
# Ray kills a worker with SIGTERM and waits this long before SIGKILL; a hung
# (stopped) rank never acts on SIGTERM, so the default 5 s only delays restarts.
LOCAL_RAY_SYSTEM_CONFIG = {"kill_worker_timeout_milliseconds": 500}
RAY_MESSAGES_FILE = "ray_messages.log"
"""In the run directory: what Ray's driver would have printed amid the run's output."""
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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


class RayMessageLog:
    """Takes the place of Ray's driver-side printer of cluster messages.

    ``log_to_driver=False`` keeps the workers' output away, but Ray's driver
    still prints the cluster's error messages ("(raylet) A worker died or was
    killed ...") to stdout in ANSI colours, in the middle of the progress
    lines. The incident the watcher records says the same thing in the run's
    own words; Ray's text goes, uncoloured and timestamped, to ``path``
    (stderr when None)."""

    def __init__(self, path: Optional[Path]) -> None:
        self.path = path

    def __call__(self, data: dict, ignore_prefix: bool = False) -> None:
        source = data.get("pid", "ray")
        lines = [f"{time.strftime('%H:%M:%S')} ({source}) {_ANSI.sub('', str(line))}\n"
                 for line in data.get("lines", [])]
        if self.path is None:
            sys.stderr.writelines(lines)
            return
        with open(self.path, "a", encoding="utf-8") as log:
            log.writelines(lines)


_ray_printer: Optional[Callable] = None
"""Ray's own printer while ours is in its place."""


def route_ray_messages(path: Optional[Path]) -> None:
    """Send Ray's driver messages to ``path`` (see :class:`RayMessageLog`).

    Ray has no setting for it: its error listener calls
    ``ray._private.worker.print_to_stdstream`` by name, which is swapped here
    (and back in :func:`disconnect`). A Ray without that name prints as it will."""
    global _ray_printer
    from ray._private import worker as ray_worker

    if _ray_printer is None and hasattr(ray_worker, "print_to_stdstream"):
        _ray_printer = ray_worker.print_to_stdstream
        ray_worker.print_to_stdstream = RayMessageLog(path)


def _restore_ray_printer() -> None:
    global _ray_printer
    if _ray_printer is not None:
        from ray._private import worker as ray_worker

        ray_worker.print_to_stdstream, _ray_printer = _ray_printer, None


def connect(cluster: ClusterConfig, messages_to: Optional[Path] = None) -> LocalCluster | None:
    """ray.init for the run; the caller passes what this returns (the local
    nodes it started, if any) to :func:`disconnect` at the end. Ray's own
    messages to the driver go to ``messages_to`` (stderr when None)."""
    import ray

    if ray.is_initialized():
        return None
    route_ray_messages(messages_to)
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
    _restore_ray_printer()
