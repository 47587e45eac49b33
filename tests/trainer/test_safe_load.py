"""A checkpoint folder is data: DCP's pickled ``.metadata`` and the pickled
non-tensor items of a state dict are read through allow-lists, so a crafted
file is refused before it runs anything; real checkpoints read as before."""

from __future__ import annotations

import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from tests.faults.checkpoint_damage import WritesAMarker, craft_metadata
from trainer.manifest import DCP_METADATA_NAME, checkpoint_dir, write_manifest
from trainer.safe_load import ForbiddenGlobalError, SafeFileSystemReader, SafeLoadPlanner, load_metadata

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

STATE = {
    "model": {"weight": torch.ones(4, 4), "half": torch.zeros(3, dtype=torch.bfloat16),
              "counts": torch.arange(5, dtype=torch.int32)},
    "optim": {"param_groups": [{"lr": 1e-3, "betas": (0.9, 0.95), "eps": 1e-8, "foreach": None,
                                "params": ["weight"], "name": "decay"}]},
    "trainer": {"step": torch.tensor(20), "scale": torch.tensor(1024.0, dtype=torch.float64)},
}


def saved(tmp_path, state=STATE):
    path = checkpoint_dir(tmp_path, 20)
    dcp.save(state, checkpoint_id=str(path), no_dist=True)
    write_manifest(path, {"step": 20})
    return path


def test_dcp_metadata_reads_through_the_allow_list_as_with_plain_pickle(tmp_path):
    path = saved(tmp_path)
    with (path / DCP_METADATA_NAME).open("rb") as handle:
        restricted = load_metadata(handle)
    assert restricted == pickle.loads((path / DCP_METADATA_NAME).read_bytes())


def test_a_state_with_non_tensor_items_loads_back_through_the_safe_reader_and_planner(tmp_path):
    path = saved(tmp_path)
    state = {"model": {name: torch.empty_like(t) for name, t in STATE["model"].items()},
             "optim": {"param_groups": [dict.fromkeys(STATE["optim"]["param_groups"][0])]},  # values to be read
             "trainer": {"step": torch.tensor(0), "scale": torch.tensor(0.0, dtype=torch.float64)}}
    dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner(), no_dist=True)
    assert all(torch.equal(state["model"][name], t) for name, t in STATE["model"].items())
    assert state["optim"] == STATE["optim"] and int(state["trainer"]["step"]) == 20


def test_a_crafted_metadata_is_refused_by_the_reader_and_runs_nothing(tmp_path):
    path, marker = saved(tmp_path), tmp_path / "code-ran"
    craft_metadata(path, marker)
    with pytest.raises(ForbiddenGlobalError, match=r"it asks for io\.open, which DCP metadata never holds"):
        with (path / DCP_METADATA_NAME).open("rb") as handle:
            load_metadata(handle)
    with pytest.raises(CheckpointException, match=r"io\.open"):
        dcp.load({"model": {"weight": torch.empty(4, 4)}}, storage_reader=SafeFileSystemReader(path), no_dist=True)
    assert not marker.exists()


def test_a_crafted_non_tensor_item_is_refused_by_the_planner_and_runs_nothing(tmp_path):
    marker = tmp_path / "code-ran"
    path = saved(tmp_path, {"trainer": {"note": WritesAMarker(marker)}})  # DCP pickles it into a shard
    with pytest.raises(CheckpointException, match="Unsupported global"):
        dcp.load({"trainer": {"note": None}}, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner(),
                 no_dist=True)
    assert not marker.exists()
    dcp.load({"trainer": {"note": None}}, checkpoint_id=str(path), no_dist=True)  # torch's own planner runs it
    assert marker.exists()
