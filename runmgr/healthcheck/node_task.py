"""What runs on one node: the probes of :func:`health.check.check_node`, with
the node's own environment applied to the mount paths, plus who the node is
(host name, Kubernetes node) so that exclusions can be acted on."""

from __future__ import annotations

import fcntl
import os
import re
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional

from health.config import HealthConfig, MountSpec
from health.findings import Finding, ProbeResult, fail

K8S_NODE_ENV = ("RUNMGR_K8S_NODE_NAME", "NODE_NAME")
"""Variables that may hold the Kubernetes node name (downward API ``spec.nodeName``)."""
HOST_ID_ENV = "RUNMGR_HOST_ID"
"""Names the machine a node runs on, where the kernel's boot id cannot tell (a sandbox
that fakes it per container); nodes with the same value share a host."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
"""The kernel's id of this boot: the same for every process and container of one machine
(containers share the host's kernel), new at each boot, different on every other machine
or VM. Ray's node IP and the host name cannot tell: pods on one machine each have their own."""
SERVICEACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
HOST_LOCK = Path(tempfile.gettempdir()) / "runmgr-health-compute.lock"
"""Taken around the compute benchmark by every node of a host (see host_turn)."""
_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def mount_variables(path: str) -> list[str]:
    """The ``$VAR`` / ``${VAR}`` names in a mount path, in order."""
    return [a or b for a, b in _VARIABLE.findall(path)]


def expand_mount_paths(config: HealthConfig, environ: Mapping[str, str]
                       ) -> tuple[HealthConfig, list[Finding]]:
    """Resolve ``$VAR`` in mount paths with this node's environment.

    Nodes may reach a shared file system by different paths (a rack's own
    server, a per-node scratch mount), so a path may name the node's
    environment. A variable the node does not set fails the node for that
    mount, with the variable named.
    """
    mounts: list[MountSpec] = []
    findings: list[Finding] = []
    for spec in config.storage.mounts:
        missing = [name for name in mount_variables(spec.path) if name not in environ]
        if missing:
            findings.append(fail(
                "storage.unresolved",
                f"{spec.path}: ${missing[0]} is not set on this node; set it in the node's "
                "environment (Ray inherits the raylet's) or fix health.storage.mounts",
                path=spec.path, variable=missing[0]))
            continue
        resolved = _VARIABLE.sub(lambda m: environ[m.group(1) or m.group(2)], spec.path)
        mounts.append(replace(spec, path=resolved))
    return replace(config, storage=replace(config.storage, mounts=mounts)), findings


def _read_text(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def host_id(environ: Mapping[str, str], boot_id_file: Path = BOOT_ID) -> Optional[str]:
    """Which machine this is (health.fleet.HOST_FACT): ``$RUNMGR_HOST_ID``, else the kernel's
    boot id, else the Kubernetes node; None when nothing tells (the node is then a host alone)."""
    if environ.get(HOST_ID_ENV):
        return f"env:{environ[HOST_ID_ENV]}"
    boot = _read_text(boot_id_file)
    if boot:
        return f"boot:{boot}"
    node_name = next((environ[k] for k in K8S_NODE_ENV if environ.get(k)), None)
    return f"k8s:{node_name}" if node_name else None


def identity_facts(environ: Mapping[str, str], hostname: str,
                   namespace_file: Path = SERVICEACCOUNT_NAMESPACE,
                   boot_id_file: Path = BOOT_ID) -> dict[str, Optional[str]]:
    """Host name, the machine (see :func:`host_id`) and, inside Kubernetes, the node
    (or the pod to look it up by)."""
    from health.fleet import HOST_FACT

    facts: dict[str, Optional[str]] = {"node.hostname": hostname}
    boot = _read_text(boot_id_file)
    if boot:
        facts["node.boot_id"] = boot
    machine = host_id(environ, boot_id_file)
    if machine:
        facts[HOST_FACT] = machine
    node_name = next((environ[k] for k in K8S_NODE_ENV if environ.get(k)), None)
    if node_name:
        facts["k8s.node_name"] = node_name
    if environ.get("KUBERNETES_SERVICE_HOST"):
        facts["k8s.pod"] = hostname  # a pod's host name is its name
        facts["k8s.namespace"] = _read_text(namespace_file)
    return facts


@contextmanager
def host_turn(lock_path: Path = HOST_LOCK):
    """One benchmark at a time per host. Ray nodes that share a machine (a test
    cluster, pods on one host) would otherwise slow each other's figures down
    and make each other look like outliers; on separate hosts nobody waits."""
    with open(lock_path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def compute_on_this_node(config: HealthConfig) -> ProbeResult:
    """The compute benchmark alone, taking its turn on the host (the fleet
    check runs it after every node's other probes, so that no node's figures
    are taken while another node on the same machine is still starting up)."""
    from health.probes.compute import probe_compute

    with host_turn():
        return probe_compute(config.compute)


def probe_this_node(config: HealthConfig, node_id: str, with_compute: bool = True) -> dict:
    """Every per-node probe of :func:`health.check.check_node`, on the node this
    runs on, the compute benchmark taking its turn on the host (unless
    ``with_compute`` is false); a JSON-able NodeReport."""
    # Imported here: torch is only needed where the probes run.
    from health.node import NodeReport
    from health.probes.compute import probe_compute
    from health.probes.data import verify_dataset
    from health.probes.devices import probe_devices
    from health.probes.software import probe_software
    from health.probes.storage import probe_storage

    started = time.time()
    expanded, problems = expand_mount_paths(config, os.environ)
    results = [probe_devices(expanded.devices), probe_storage(expanded.storage),
               verify_dataset(expanded.data), probe_software()]
    if with_compute:
        with host_turn():
            results.append(probe_compute(expanded.compute))
    report = NodeReport.from_probes(node_id, results, started, time.time() - started)
    report.findings.extend(problems)
    report.facts.update(identity_facts(os.environ, socket.gethostname()))
    return report.to_dict()
