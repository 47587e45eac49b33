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
