"""The process groups of a layout, as one DeviceMesh with named dimensions
``pp``, ``dp`` and ``tp`` (in the rank order of :mod:`trainer.parallel.layout`)."""

from __future__ import annotations

from typing import Optional

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.parallel.layout import Layout

MESH_DIMS = ("pp", "dp", "tp")


def build_mesh(layout: Layout, device_type: str) -> Optional[DeviceMesh]:
    """A mesh over every rank (the default process group must exist), or
    None for plain data parallel, whose one all-reduce runs on the default
    group. ``device_type``: ``cpu`` (gloo), ``cuda`` (NCCL) or ``npu`` (HCCL),
    the device layer's torch device type."""
    if layout.plain:
        return None
    return init_device_mesh(device_type, (layout.pp, layout.dp, layout.tp), mesh_dim_names=MESH_DIMS)


def release_groups(mesh: Optional[DeviceMesh]) -> None:
    """Let go of the process groups ``mesh`` holds, so that they close once destroyed. A mesh
    outlives its model: DTensor's caches of sharding plans keep every mesh they saw, and a mesh
    keeps its groups by name (``_pg_registry``, read only while torch.compile traces); a gloo
    group's connections close only when nothing holds it (gloo has no abort), and a peer still
    waiting on one would wait out the group's timeout."""
    if mesh is not None:
        getattr(mesh, "_pg_registry", {}).clear()
