"""Ways to damage a checkpoint that its manifest cannot catch, shared by the
fault tests and the unit tests beside the code (with a small real checkpoint
to damage).

- An unreadable shard. ``chmod 000`` stops every user but root: root reads
  any file through CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH. A process started
  through :func:`reader_prefix` runs without those two capabilities
  (``setpriv``), so it obeys the file's mode like anyone and ``open`` fails
  with PermissionError, as it does for a non-root user.
- A crafted DCP ``.metadata``: a pickle whose ``__reduce__`` creates a marker
  file, with the manifest's sizes and hashes rewritten to vouch for it, so
  that only the way it is unpickled can stop it.
"""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp

from trainer.manifest import DCP_METADATA_NAME, checkpoint_dir, read_manifest, write_manifest

WITHOUT_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search",
               "--bounding-set=-dac_override,-dac_read_search"]


def small_checkpoint(save_dir: Path, step: int, manifest: bool = True) -> Path:
    """A real DCP checkpoint of one tensor at ``step`` (``consumed_samples`` 8 per step),
    with its manifest unless ``manifest`` is False (a save that did not finish)."""
    path = checkpoint_dir(save_dir, step)
    state = {"model": {"weight": torch.full((64, 64), float(step))}, "step": torch.tensor(step)}
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    if manifest:
        write_manifest(path, {"step": step, "consumed_samples": 8 * step})
    return path


def reader_prefix() -> list[str]:
    """The command prefix under which a ``chmod 000`` file cannot be read: nothing
    for a non-root user, :data:`WITHOUT_DAC` for root (the test is skipped when
    root has no setpriv)."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv (util-linux): no way to make a file unreadable")
    return list(WITHOUT_DAC)


class WritesAMarker:
    """What a crafted pickle holds: unpickling it opens (creates) ``marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def rewrite_manifest(checkpoint: Path) -> None:
    """The manifest's sizes and hashes made to match the files now there (its other fields kept)."""
    fields = {k: v for k, v in read_manifest(checkpoint).items() if k not in ("format", "files")}
    write_manifest(checkpoint, fields)


def craft_metadata(checkpoint: Path, marker: Path) -> Path:
    """Replace ``checkpoint``'s ``.metadata`` by a pickle that creates ``marker``
    and make the manifest vouch for it; check that it is live (plain pickle runs
    it), then remove the marker. Returns the crafted file."""
    crafted = checkpoint / DCP_METADATA_NAME
    crafted.write_bytes(pickle.dumps(WritesAMarker(marker)))
    rewrite_manifest(checkpoint)
    pickle.loads(crafted.read_bytes())
    assert marker.exists(), "the crafted pickle does not run: the tests using it would prove nothing"
    marker.unlink()
    return crafted
