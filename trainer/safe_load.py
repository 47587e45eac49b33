"""Reading a DCP checkpoint as data, never as code.

torch.distributed.checkpoint keeps its ``.metadata`` as a pickle and reads it
with plain ``pickle.load`` (torch 2.13: ``FileSystemReader.read_metadata``);
the non-tensor items of a state dict (an optimizer's ``param_groups``) are
read with ``torch.load(weights_only=False)`` (``DefaultLoadPlanner.load_bytes``).
Either runs whatever a crafted file asks for. Here the metadata goes through
an unpickler that resolves only the classes DCP writes into it, and the
non-tensor items through ``torch.load(weights_only=True)``; anything else is
refused with the name of what the file asked for.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import IO, Any, Optional

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
METADATA_GLOBALS = frozenset({
    (_DCP_METADATA, "Metadata"),
    (_DCP_METADATA, "MetadataIndex"),
    (_DCP_METADATA, "StorageMeta"),
    (_DCP_METADATA, "TensorStorageMetadata"),
    (_DCP_METADATA, "BytesStorageMetadata"),
    (_DCP_METADATA, "ChunkStorageMetadata"),
    (_DCP_METADATA, "TensorProperties"),
    (_DCP_METADATA, "_MEM_FORMAT_ENCODING"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),  # a layout by its name, from torch's own table
    ("torch", "Size"),
    ("pathlib", "PosixPath"),  # StorageMeta.checkpoint_id
})
"""Every global DCP's ``.metadata`` refers to (besides dtypes): its own dataclasses
and the few torch and standard types inside them. Each is data; none runs a command."""

TORCH_DTYPES = frozenset({
    "float64", "float32", "float16", "bfloat16", "complex128", "complex64", "complex32",
    "int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu",
})
"""``torch.<dtype>`` names a tensor's properties may hold (read as attributes, never called)."""


class ForbiddenGlobalError(pickle.UnpicklingError):
    """A pickle in a checkpoint asks for something DCP's metadata never holds."""


class MetadataUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`METADATA_GLOBALS` and torch dtypes."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in METADATA_GLOBALS or (module == "torch" and name in TORCH_DTYPES):
            return super().find_class(module, name)
        asked = " ".join(f"{module}.{name}".split())[:200]  # a crafted name may hold anything
        raise ForbiddenGlobalError(f"it asks for {asked}, which DCP metadata never holds "
                                   f"(a checkpoint folder is data, not code to run)")


def load_metadata(stream: IO[bytes]) -> Metadata:
    """DCP metadata from ``stream`` through :class:`MetadataUnpickler`; raises
    :class:`pickle.UnpicklingError` (or what a garbled pickle raises) otherwise."""
    metadata = MetadataUnpickler(stream).load()
    if not isinstance(metadata, Metadata):
        raise pickle.UnpicklingError(f"it holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


# What unpickling garbage may raise, besides the refusals above.
_GARBLED = (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError,
            OverflowError)


def metadata_problem(path: Path) -> Optional[str]:
    """Why the DCP metadata file at ``path`` is not plain DCP metadata, or None.
    Nothing in it is executed: see :class:`MetadataUnpickler`."""
    try:
        with path.open("rb") as handle:
            load_metadata(handle)
    except OSError as error:
        return f"file {path.name} cannot be read ({error.strerror or error})"
    except _GARBLED as error:
        return f"file {path.name} is not plain DCP metadata: {error}"
    return None


class SafeFileSystemReader(FileSystemReader):
    """DCP's file-system reader, reading ``.metadata`` through :class:`MetadataUnpickler`."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        # As FileSystemReader.read_metadata in torch 2.13, with the unpickler swapped;
        # ``rank`` selects DCP's rank-local ``__N.metadata``.
        path = self._get_metadata_path(kwargs.get("rank"))
        with self.fs.create_stream(path, "rb") as stream:
            metadata = load_metadata(stream)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner, reading non-tensor items with ``weights_only=True``
    (plain numbers, strings, tuples, lists and dicts: an optimizer's param_groups)."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        # As DefaultLoadPlanner.load_bytes in torch 2.13, with weights_only=True.
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
