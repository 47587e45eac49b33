"""Connecting to Ray: an existing cluster (``cluster.address``) or a local
one started for the run. An unreachable address is one clear line. A local Ray
that does not start within Ray's own time (a busy machine) is stopped and started
again, a few times at most (:func:`start_local`), and then it is one line too.

A local Ray comes with a reaper (runmgr/reaper.py): none of its processes
outlives the driver. A launch also watches the cluster's head
(runmgr/headwatch.py): the worker group asks :func:`check_head` on every poll,
so a head that is gone ends the sub-run before Ray ends the driver.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, MutableMapping, Optional, TypeVar

from runmgr.config.schema import ClusterConfig
from runmgr.errors import ClusterError, RayStartTimeoutError
from runmgr.headwatch import HeadExit, HeadWatch, no_local_head
from runmgr.reaper import Reaper, reap

CONNECT_TIMEOUT_S = 5.0
LOCAL_RAY_SYSTEM_CONFIG = {
    # Ray kills a worker with SIGTERM and waits this long before SIGKILL; a hung
    # (stopped) rank never acts on SIGTERM, so the default 5 s only delays restarts.
    "kill_worker_timeout_milliseconds": 500,
    # A local run reads neither Ray's metrics nor its task events. Flushing them
    # to a head that is gone kept ray.shutdown() waiting for 15 s.
    "enable_metrics_collection": False,
    "task_events_shutdown_flush_timeout_ms": 500,
    # Ray starts its workers at nice 15. The ranks are what the machine is for: at
    # nice 15 anything else on the host (a busy neighbour, an agent) takes ~97% of
    # a core from them, and the health check's benchmark measures the neighbour.
    "worker_niceness": 0,
    # Ray starts idle workers ahead of tasks (one per CPU when the driver connects); each
    # imports Ray (~0.6 CPU-seconds) and a run's actors want processes of their own anyway.
    "prestart_worker_first_driver": False,
    "enable_worker_prestart": False,
}
LOCAL_HEAD_PROCESSES = {"include_dashboard": False, "no_monitor": True, "include_log_monitor": False}
"""What a run's own local Ray leaves out of its head: the dashboard, the autoscaler's monitor (a
local cluster has nothing to scale) and the log monitor (the driver takes no worker output,
``log_to_driver=False``; each worker still writes its own log files). About 1.5 CPU-seconds and
2-3 s of a start on a 2-core machine."""
LOCAL_RAY_ENVIRONMENT = {
    # Ray's usage statistics go to usage-stats.ray.io unless disabled: a local run talks to this
    # machine only.
    "RAY_USAGE_STATS_ENABLED": "0",
    # Disabled, a head not started by ray.init (ray.cluster_utils, as LocalCluster's) still sends
    # one "disabled" report to this address: a scheme that requests refuses before any lookup or
    # connection, so that report is never sent.
    "RAY_USAGE_STATS_REPORT_URL": "unsent://runmgr-local-ray/",
}
"""What a local Ray's processes (the children of the process that starts it) find in their
environment, unless its user set Ray's usage statistics on (``RAY_USAGE_STATS_ENABLED=1``)."""
DRIVER_INIT_KWARGS = {"logging_level": logging.ERROR, "log_to_driver": False}
"""ray.init's settings for the driver, whichever cluster it joins or starts."""
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


def keep_local_ray_offline(environ: MutableMapping[str, str]) -> None:
    """:data:`LOCAL_RAY_ENVIRONMENT` into ``environ`` (the starting process's, which Ray's daemons
    inherit), each variable unless already set; nothing if its user turned usage statistics on."""
    if environ.get("RAY_USAGE_STATS_ENABLED") == "1":
        return
    for name, value in LOCAL_RAY_ENVIRONMENT.items():
        environ.setdefault(name, value)


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
    """Ray nodes on this machine: several (``cluster.local_nodes`` > 1), one rank each, so that a
    node can be excluded and its ranks moved to a spare; or one, started without the head
    processes a local run does not use (``LOCAL_HEAD_PROCESSES``, which ``ray.init`` cannot leave
    out)."""

    def __init__(self, cluster: ClusterConfig, head_cpus: Optional[int] = None) -> None:
        """``head_cpus``: what the head advertises (one rank's CPUs unless given)."""
        from ray.cluster_utils import Cluster

        keep_local_ray_offline(os.environ)
        node_args = {"num_cpus": local_node_cpus(cluster)}
        # A copy: Ray writes into the dict it is given (the spilling directory of that start's session).
        head_args = {**node_args, **LOCAL_HEAD_PROCESSES, "_system_config": dict(LOCAL_RAY_SYSTEM_CONFIG)}
        if head_cpus is not None:
            head_args["num_cpus"] = head_cpus
        self._cluster = Cluster(initialize_head=True, head_node_args=head_args)
        # Cluster() records itself as "the current cluster" of this machine
        # (/tmp/ray/ray_current_cluster), which a plain ray.init() elsewhere would
        # then join: this cluster is the run's alone.
        address_file = _ray_address_file()
        if os.path.exists(address_file):
            os.remove(address_file)
        self.reaper = Reaper.start(self._cluster.head_node.get_session_dir_path())
        self.head_node = self._cluster.head_node
        try:
            for _ in range(cluster.local_nodes - 1):
                self._cluster.add_node(**node_args)
        except BaseException:
            self.reaper.reap()  # the head, the nodes added and what the failed one started
            raise
        self.address = self._cluster.address

    def shutdown(self) -> None:
        self._cluster.shutdown()
        self.reaper.reap()


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
        try:
            with open(self.path, "a", encoding="utf-8") as log:
                log.writelines(lines)
        except OSError:  # a full disk, say: Ray's message still reaches a person, not a traceback
            sys.stderr.writelines(lines)


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


@dataclass
class RayConnection:
    """What :func:`connect` started or joined; :func:`disconnect` takes it back."""

    local_nodes: Optional[LocalCluster] = None
    """The local Ray this process started (None: a cluster joined by address)."""
    reaper: Optional[Reaper] = None
    """Kills the local Ray's processes when the driver goes (None: a cluster joined by address)."""
    head: Optional[HeadWatch] = None
    """Watches the cluster's head (None: not asked for)."""
    local_head: Any = None
    """The head node of a local Ray (Ray's ``Node``, whose processes this one started)."""


_connection: Optional[RayConnection] = None
"""This process's connection: Ray's own is process-wide (ray.init) too."""


def connect(cluster: ClusterConfig, messages_to: Optional[Path] = None,
            head_lost_after_s: Optional[float] = None) -> RayConnection | None:
    """ray.init for the run; the caller passes what this returns to
    :func:`disconnect` at the end (None: Ray was already initialised here).
    Ray's own messages to the driver go to ``messages_to`` (stderr when None).
    With ``head_lost_after_s`` the cluster's head is watched (:func:`check_head`).
    A local Ray whose start runs out of Ray's time is started again (:func:`start_local`)."""
    import ray

    global _connection
    if ray.is_initialized():
        return None
    route_ray_messages(messages_to)
    try:
        connection = _init(cluster)
    except BaseException:
        _restore_ray_printer()  # nothing to disconnect: the printer goes back here
        raise
    if head_lost_after_s is not None:
        head_exit = gcs_exit(connection.local_head) if connection.local_head is not None else no_local_head
        connection.head = watch_head(head_lost_after_s, head_exit)
    _connection = connection
    return connection


def _init(cluster: ClusterConfig) -> RayConnection:
    import ray

    if cluster.address and cluster.address != "auto":
        check_reachable(cluster.address)
        ray.init(address=cluster.address, **DRIVER_INIT_KWARGS)
        return RayConnection()
    if cluster.address == "auto":
        ray.init(address="auto", **DRIVER_INIT_KWARGS)
        return RayConnection()
    # Only a Ray of this process's own is started again: never a connection to someone's cluster.
    return start_local(lambda: start_own_ray(cluster))


def start_own_ray(cluster: ClusterConfig) -> RayConnection:
    """Start a local Ray of the run's own (one node, or :class:`LocalCluster`) and connect to it: one
    try, which :func:`start_local` repeats while Ray's start-up runs out of time."""
    import ray

    # One node too is started as a cluster of this process's own, never joined through whatever
    # /tmp/ray/ray_current_cluster points at: ray.init(address="local") would also start the
    # autoscaler's monitor and the log monitor (about 1.1 CPU-seconds a start).
    local = LocalCluster(cluster, head_cpus=None if cluster.local_nodes > 1 else local_ray_cpus(cluster))
    ray.init(address=local.address, **DRIVER_INIT_KWARGS)
    return RayConnection(local_nodes=local, reaper=local.reaper, local_head=local.head_node)


LOCAL_START_TRIES = 3
"""Starts of a local Ray, at most, while each runs out of Ray's own start-up time."""
_RAYLET_TIMED_OUT = re.compile(r"The current node timed out during startup")
"""ray/_private/node.py, a bare Exception: the raylet did not register with the GCS within a
hard-coded 30 s (seen on a 2-core machine at load ~15)."""
_GCS_PORT_TIMED_OUT = re.compile(r"Timed out waiting for file \S*gcs_server_port")
"""ray._raylet.wait_for_persisted_port, a RuntimeError: the GCS did not write its port file within
``RAY_gcs_server_port_wait_time_s`` (30 s unless set)."""
_NODE_WAIT_TIMED_OUT = re.compile(r"Timed out after (\d+) seconds while waiting for node to startup")
"""ray/_private/services.py ``wait_for_node``, a TimeoutError: ray.cluster_utils.Cluster's added
node did not appear in the GCS's node table in time."""
RAY_GCS_PORT_WAIT_VARIABLE = "RAY_gcs_server_port_wait_time_s"


def ray_start_timed_out(error: BaseException) -> Optional[str]:
    """What did not come up in time, when ``error`` is Ray saying that a start ran out of its
    time (one of the three above); None for any other error."""
    text = str(error)
    if _RAYLET_TIMED_OUT.search(text):
        return "its node did not register within Ray's 30 s"
    if isinstance(error, RuntimeError) and _GCS_PORT_TIMED_OUT.search(text):
        wait_s = os.environ.get(RAY_GCS_PORT_WAIT_VARIABLE, "30")
        return f"its GCS did not start within {wait_s} s (Ray's {RAY_GCS_PORT_WAIT_VARIABLE})"
    found = _NODE_WAIT_TIMED_OUT.search(text) if isinstance(error, TimeoutError) else None
    if found:
        return f"a node did not join within Ray's {found[1]} s"
    return None


def own_ray_sessions() -> set[str]:
    """The session directories of the Rays this process started: Ray names a head's
    ``session_<time>_<pid>`` under its temp directory, and every node of it writes there."""
    from ray._common.utils import get_default_ray_temp_dir

    return set(glob.glob(os.path.join(glob.escape(get_default_ray_temp_dir()), f"session_*_{os.getpid()}")))


def stop_failed_start(sessions_before: set[str]) -> None:
    """Stop what a failed start of a local Ray left running: Ray's driver state here, and every
    process of the sessions begun since ``sessions_before`` (ray.shutdown() alone leaves the GCS
    of a node that never came up running)."""
    import ray

    ray.shutdown()
    for session_dir in sorted(own_ray_sessions() - sessions_before):
        reap(session_dir)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


Started = TypeVar("Started")


def start_local(start: Callable[[], Started], tries: int = LOCAL_START_TRIES,
                say: Callable[[str], None] = _to_stderr) -> Started:
    """``start()`` (a local Ray of this process's own), again after what it started is stopped
    while Ray says its start ran out of time, ``tries`` times at most, each retry said by
    ``say``; then :class:`RayStartTimeoutError`, one line. Any other error goes on as it is."""
    for attempt in range(1, tries + 1):
        sessions = own_ray_sessions()
        try:
            return start()
        except Exception as error:  # noqa: BLE001 - Ray raises a bare Exception for one of them; others re-raised
            why = ray_start_timed_out(error)
            if why is None:
                raise
            stop_failed_start(sessions)
            if attempt == tries:
                raise RayStartTimeoutError(_did_not_start(why, tries)) from None
            say(f"runmgr: the local Ray did not start: {why}; stopped what it started, starting it again "
                f"(try {attempt + 1} of {tries})")
    raise ValueError(f"start_local needs at least one try, not {tries}")


def _did_not_start(why: str, tries: int) -> str:
    """The one line of :class:`RayStartTimeoutError`: what timed out, the machine's load, what to do."""
    load = os.getloadavg()[0]
    return (f"the local Ray did not start in {tries} {'try' if tries == 1 else 'tries'}: {why}, and this "
            f"machine's load is {load:.1f} on {os.cpu_count()} cores: run the same command again when it is "
            f"less busy")


def gcs_exit(head_node) -> HeadExit:
    """How the GCS process of a head node this process started ended (None while it runs)."""
    from ray._private import ray_constants

    infos = head_node.all_processes.get(ray_constants.PROCESS_TYPE_GCS_SERVER, [])
    process = infos[0].process if infos else None

    def exited() -> Optional[str]:
        if process is None or process.poll() is None:
            return None
        code = process.returncode
        return f"(pid {process.pid}) " + (f"was killed by signal {-code}" if code < 0 else f"exited with code {code}")
    return exited


def gcs_answers(timeout_s: float) -> bool:
    """A cheap question to the GCS (does a key exist): True when it answers within ``timeout_s``."""
    from ray._private import worker as ray_worker
    from ray.exceptions import RpcError

    try:
        ray_worker.global_worker.gcs_client.internal_kv_exists(b"runmgr-head-probe", b"runmgr", timeout=timeout_s)
    except RpcError:
        return False
    return True


def watch_head(lost_after_s: float, head_exit: HeadExit = no_local_head) -> HeadWatch:
    """Start watching the connected cluster's head."""
    import ray

    watch = HeadWatch(ray.get_runtime_context().gcs_address, gcs_answers, lost_after_s, head_exit)
    watch.start()
    return watch


def check_head() -> None:
    """Raise :class:`~runmgr.errors.ClusterLostError` when the watched head is gone
    (nothing is watched outside a launch)."""
    if _connection is not None and _connection.head is not None:
        _connection.head.check()


def get_while_head_lives(refs: list, timeout_s: float) -> list:
    """``ray.get(refs, timeout=timeout_s)`` in waits of a second, checking between
    them that the watched head is there: without it an actor is never placed and
    the call would wait until Ray ends the driver. Raises Ray's GetTimeoutError
    after ``timeout_s``, :class:`ClusterLostError` once the head is gone."""
    import ray
    from ray.exceptions import GetTimeoutError

    deadline = time.monotonic() + timeout_s
    while True:
        check_head()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise GetTimeoutError(f"{len(refs)} objects not ready within {timeout_s:.0f} s")
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=min(1.0, remaining))
        if len(ready) == len(refs):
            return ray.get(refs)


def head_lost() -> bool:
    """True when the watched head is gone: calls that need it would wait for Ray's 60 s."""
    return _connection is not None and _connection.head is not None and _connection.head.lost() is not None


RAY_SHUTDOWN_WAIT_S = 30.0
"""How long :func:`shutdown_ray` lets ``ray.shutdown()`` take before it ends a local Ray's processes."""


def shutdown_ray(stop_local: Optional[Callable[[], None]] = None, wait_s: float = RAY_SHUTDOWN_WAIT_S) -> bool:
    """``ray.shutdown()``, bounded; whether it returned. Ray's shutdown can block for ever in its
    GCS error subscriber's close, a gRPC call without a deadline (seen once in a suite at stop 57: a
    session fixture's shutdown waited on its idle local GCS, in a pytest worker that a test had
    forked, a copy of its Ray driver that then ended on its own; ray-project/ray#44836 and #45044
    are hangs of the same subscriber). After ``wait_s``, ``stop_local`` (a local Ray's processes ended,
    which fails that call) and as long again; a Ray joined by address is left to its own."""
    import ray

    shutting = threading.Thread(target=ray.shutdown, name="ray-shutdown", daemon=True)
    shutting.start()
    shutting.join(wait_s)
    if shutting.is_alive() and stop_local is not None:
        stop_local()
        shutting.join(wait_s)
    return not shutting.is_alive()


def disconnect(connection: RayConnection | None = None) -> None:
    """Shut Ray down for this process; no process of a local Ray is left behind."""
    import ray

    global _connection
    lost = connection is not None and connection.head is not None and connection.head.lost() is not None
    if connection is not None and connection.head is not None:
        connection.head.stop()
    if lost and connection.reaper is not None:
        # A Ray without its head cannot be asked to stop: end its processes first, so
        # that ray.shutdown() does not wait on them.
        connection.reaper.reap()
    if ray.is_initialized():
        shutdown_ray(connection.reaper.reap if connection is not None and connection.reaper is not None else None)
    if connection is not None and connection.local_nodes is not None:
        connection.local_nodes.shutdown()
    if connection is not None and connection.reaper is not None:
        connection.reaper.reap()  # what ray.shutdown() left behind (agents, a late worker)
    if _connection is connection:
        _connection = None
    _restore_ray_printer()
