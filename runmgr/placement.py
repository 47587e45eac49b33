"""Ray resources per rank: the runmgr half of the device layer.

Ray places NVIDIA GPUs under its native ``GPU`` resource and Ascend NPUs under
``NPU``; this mapping is the only place runmgr names them.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Mapping, Sequence

RAY_ACCELERATOR_RESOURCE = {"cuda": "GPU", "npu": "NPU"}


def bundle_for(device_kind: str, cpus: float, devices: int) -> dict[str, float]:
    """The placement-group bundle of one rank."""
    bundle: dict[str, float] = {"CPU": float(cpus)}
    resource = RAY_ACCELERATOR_RESOURCE.get(device_kind)
    if resource and devices > 0:
        bundle[resource] = float(devices)
    return bundle


def accelerator_resource(device_kind: str) -> str | None:
    return RAY_ACCELERATOR_RESOURCE.get(device_kind)


def local_accelerator_resources(environ: Mapping[str, str] = os.environ, root: str = "/") -> dict[str, float]:
    """The accelerators a local Ray started on this machine would advertise (``GPU``, ``NPU``;
    only those present), counted as Ray's accelerator managers count them: the visible-devices
    variable when it is set, else the devices the driver exposes (``/proc/driver/nvidia/gpus/*``,
    ``/dev/davinci<N>``). Neither torch nor Ray is imported: a dry run stays without Ray, and a
    launch's driver spares torch's import (about 2 CPU-seconds)."""
    found = {}
    for resource, (variable, pattern) in _VISIBLE_DEVICES.items():
        visible = environ.get(variable)
        if visible is not None:
            count = len([d for d in visible.split(",") if d.strip()])
        else:
            count = len([p for p in glob.glob(os.path.join(root, pattern)) if _DEVICE_NAME.search(p)])
        if count:
            found[resource] = float(count)
    return found


_VISIBLE_DEVICES = {"GPU": ("CUDA_VISIBLE_DEVICES", "proc/driver/nvidia/gpus/*"),
                    "NPU": ("ASCEND_RT_VISIBLE_DEVICES", "dev/davinci*")}
"""Per Ray resource: the variable that narrows the devices a process sees, and where the driver
lists them."""
_DEVICE_NAME = re.compile(r"(gpus/[^/]+|davinci\d+)$")
"""A device's own entry (``/dev/davinci_manager`` is not a device)."""


def visible_devices_variable(device_kind: str) -> str | None:
    """The variable that narrows the devices a process of ``device_kind`` sees, as Ray sets it
    for an actor that holds some (``CUDA_VISIBLE_DEVICES``, ``ASCEND_RT_VISIBLE_DEVICES``); None
    for a kind without accelerators."""
    resource = RAY_ACCELERATOR_RESOURCE.get(device_kind)
    return _VISIBLE_DEVICES[resource][0] if resource else None


def rank_device_env(device_kind: str, node_device_ids: Sequence[str], devices_per_rank: int,
                    local_index: int) -> dict[str, str]:
    """The environment that gives the ``local_index``-th of a node's ranks exactly its own
    devices: the ``devices_per_rank`` ids after those of the ranks before it, out of the ids Ray
    gave the node's agent, in the variable Ray would have set for a per-rank actor. Empty on a
    kind without accelerators, or when a rank holds none; a ``ValueError`` when the agent holds
    too few ids for this rank (it would otherwise see another rank's, or every device)."""
    variable = visible_devices_variable(device_kind)
    if variable is None or devices_per_rank <= 0:
        return {}
    first = local_index * devices_per_rank
    own = list(node_device_ids[first:first + devices_per_rank])
    if len(own) < devices_per_rank:
        raise ValueError(f"the node's agent holds {len(node_device_ids)} {device_kind} device(s) "
                         f"({','.join(node_device_ids) or 'none'}): too few for its rank #{local_index + 1} "
                         f"of {devices_per_rank} each")
    return {variable: ",".join(own)}


def node_bundle(device_kind: str, cpus_per_rank: float, devices_per_rank: int, ranks: int) -> dict[str, float]:
    """The bundle of ``ranks`` ranks that must sit on one node (a Megatron node's torchrun)."""
    return bundle_for(device_kind, cpus_per_rank * ranks, devices_per_rank * ranks)


def lacking(bundle: Mapping[str, float], resources: Mapping[str, float]) -> float:
    """How far a node is from holding one ``bundle``: the fraction of each resource it lacks,
    summed (0: it holds one)."""
    return sum(max(0.0, amount - resources.get(key, 0.0)) / amount for key, amount in bundle.items() if amount > 0)


def closest_node(bundle: Mapping[str, float], nodes: Mapping[str, Mapping[str, float]]) -> str | None:
    """The name of the node that comes closest to holding one ``bundle`` (the first on a tie);
    None when there is no node."""
    return min(nodes, key=lambda name: lacking(bundle, nodes[name]), default=None)


def amounts(resources: Mapping[str, float], keys: Iterable[str]) -> str:
    """``CPU 2, GPU 8``: the ``keys`` of ``resources`` (0 where it has none), as Ray names them."""
    return ", ".join(f"{key} {resources.get(key, 0.0):g}" for key in keys)


def actor_resources(device_kind: str, cpus: float, devices: int) -> dict:
    """Keyword options of ``.options()`` asking for one rank's bundle
    (Ray wants ``num_gpus`` for GPUs and ``resources`` for anything else)."""
    options: dict = {"num_cpus": float(cpus)}
    resource = RAY_ACCELERATOR_RESOURCE.get(device_kind)
    if resource == "GPU" and devices > 0:
        options["num_gpus"] = float(devices)
    elif resource and devices > 0:
        options["resources"] = {resource: float(devices)}
    return options


def resolve_device_kind(configured: str, cluster_resources: dict) -> str:
    """``auto`` becomes what the cluster offers: NPU, then GPU, then cpu."""
    if configured != "auto":
        return configured
    for kind, resource in (("npu", "NPU"), ("cuda", "GPU")):
        if cluster_resources.get(resource, 0) > 0:
            return kind
    return "cpu"


ASCEND_ENV = {
    "PYTORCH_NPU_ALLOC_CONF": "expandable_segments:True",  # what MindSpeed-LLM's scripts set: less fragmentation
    "HCCL_CONNECT_TIMEOUT": "3600",  # seconds for the ranks to link up; HCCL's 120 s is short for a large job
}
"""What an Ascend Megatron job's processes need besides the visible devices Ray sets."""


def device_env(device_kind: str, flavor: str) -> dict[str, str]:
    """Environment of a Megatron job's processes on ``device_kind`` (``cuda``, ``npu``, ``cpu``;
    already resolved from ``auto``). The visible devices are the ones Ray gave the node's actor
    (CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES), inherited as they are. ``flavor`` is the
    Megatron flavor; both flavors want one hardware queue per device, so that a tensor-parallel
    communication is scheduled before the computation that overlaps it."""
    if device_kind not in ("cuda", "npu", "cpu"):
        raise ValueError(f"no Megatron environment for device kind {device_kind!r}: resolve 'auto' first")
    if device_kind == "cpu":
        return {}
    env = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # Megatron-LM and MindSpeed-LLM both assert or warn without it
    if device_kind == "npu":
        env.update(ASCEND_ENV)
    return env
