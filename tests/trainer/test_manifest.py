"""Which checkpoints are trusted: manifests, verification with reasons a
person understands, the newest verified one, pruning and retiring. The
checkpoints are real torch.distributed.checkpoint directories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.checkpoint_damage import craft_metadata, reader_prefix, small_checkpoint
from trainer.manifest import (
    checkpoint_dir,
    find_latest_verified,
    list_checkpoints,
    prune_checkpoints,
    read_manifest,
    recorded_shapes,
    retire_checkpoints_after,
    shape_mismatch,
    verify_checkpoint,
)

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def data_file(path: Path) -> Path:
    return next(path.glob("*.distcp"))


def test_a_complete_checkpoint_verifies_and_its_manifest_lists_every_file(tmp_path):
    path = small_checkpoint(tmp_path, 120)
    assert verify_checkpoint(path) == (True, "ok")
    manifest = read_manifest(path)
    assert manifest["step"] == 120 and manifest["consumed_samples"] == 960
    assert {f["name"] for f in manifest["files"]} == {".metadata", data_file(path).name}
    assert not list(path.glob("*.tmp"))


def test_a_truncated_file_is_rejected_with_sizes(tmp_path):
    path = small_checkpoint(tmp_path, 120)
    target = data_file(path)
    size = target.stat().st_size
    target.write_bytes(target.read_bytes()[:1000])
    ok, reason = verify_checkpoint(path)
    assert not ok
    assert reason == f"step_00000120: file {target.name} is 1000 bytes, manifest says {size} (truncated)"


def test_an_altered_byte_is_rejected_by_its_checksum(tmp_path):
    path = small_checkpoint(tmp_path, 120)
    target = data_file(path)
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    ok, reason = verify_checkpoint(path)
    assert not ok and reason.startswith(f"step_00000120: file {target.name} has sha256 ") and reason.endswith("(corrupted)")
    assert verify_checkpoint(path, check_hashes=False) == (True, "ok")  # the cheap check cannot see it


def test_missing_manifest_metadata_or_garbled_manifest_are_rejected(tmp_path):
    unfinished = small_checkpoint(tmp_path, 10, manifest=False)
    assert verify_checkpoint(unfinished) == (False, "step_00000010: no manifest.json (the save did not finish)")
    no_metadata = small_checkpoint(tmp_path, 20)
    (no_metadata / ".metadata").unlink()
    assert verify_checkpoint(no_metadata) == (False, "step_00000020: file .metadata is missing")
    garbled = small_checkpoint(tmp_path, 30)
    (garbled / "manifest.json").write_text('{"step": 30, "files": [')
    ok, reason = verify_checkpoint(garbled)
    assert not ok and reason.startswith("step_00000030: manifest.json cannot be read")
    moved = small_checkpoint(tmp_path, 40)
    manifest = json.loads((moved / "manifest.json").read_text())
    (moved / "manifest.json").write_text(json.dumps({**manifest, "step": 41}))
    assert verify_checkpoint(moved) == (False, "step_00000040: manifest says step 41 but the directory is step_00000040")


def verified_by_another_process(path: Path, prefix: list[str]) -> list:
    """verify_checkpoint(path) in a child process started under ``prefix``."""
    code = ("import json, sys; from trainer.manifest import verify_checkpoint; "
            "print(json.dumps(verify_checkpoint(sys.argv[1])))")
    out = subprocess.run([*prefix, sys.executable, "-c", code, str(path)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr  # a reason, not a traceback
    return json.loads(out.stdout)


def test_a_shard_that_cannot_be_read_is_rejected_with_a_reason(tmp_path):
    path = small_checkpoint(tmp_path, 20)
    data_file(path).chmod(0)
    assert verified_by_another_process(path, reader_prefix()) == [
        False, f"step_00000020: file {data_file(path).name} cannot be read (Permission denied)"]


def test_a_shard_replaced_by_a_directory_or_a_fifo_is_rejected_without_opening_it(tmp_path):
    as_directory, as_fifo = small_checkpoint(tmp_path, 10), small_checkpoint(tmp_path, 20)
    name = data_file(as_directory).name
    (as_directory / name).unlink()
    (as_directory / name).mkdir()
    (as_fifo / name).unlink()
    os.mkfifo(as_fifo / name)  # opening it to hash would wait for a writer forever
    assert verify_checkpoint(as_directory) == (False, f"step_00000010: file {name} is a directory, not a regular file")
    assert verify_checkpoint(as_fifo) == (False, f"step_00000020: file {name} is a FIFO, not a regular file")


def test_a_crafted_metadata_is_rejected_without_running_it(tmp_path):
    path, marker = small_checkpoint(tmp_path, 20), tmp_path / "code-ran"
    craft_metadata(path, marker)  # sizes and hashes vouch for it
    ok, reason = verify_checkpoint(path)
    assert not ok and not marker.exists()
    assert reason.startswith("step_00000020: file .metadata is not plain DCP metadata: it asks for io.open, ")
    assert verify_checkpoint(path, check_hashes=False) == (True, "ok")  # the cheap check does not read it


def test_find_latest_verified_falls_back_past_broken_ones(tmp_path):
    for step in (10, 20):
        small_checkpoint(tmp_path, step)
    corrupted = small_checkpoint(tmp_path, 30)
    data_file(corrupted).write_bytes(b"")
    small_checkpoint(tmp_path, 40, manifest=False)
    latest = find_latest_verified(tmp_path)
    assert latest.step == 20 and latest.path == checkpoint_dir(tmp_path, 20)
    assert latest.manifest["consumed_samples"] == 160
    assert [Path(p).name for p, _ in latest.rejected] == ["step_00000040", "step_00000030"]
    assert "no manifest.json" in latest.rejected[0][1] and "(truncated)" in latest.rejected[1][1]


def test_find_latest_verified_in_an_empty_or_missing_directory(tmp_path):
    assert find_latest_verified(tmp_path / "nothing").path is None
    assert find_latest_verified(tmp_path).rejected == []


def test_prune_keeps_the_newest_complete_ones_and_the_protected_one(tmp_path):
    paths = {step: small_checkpoint(tmp_path, step) for step in (10, 20, 30, 40)}
    crashed = small_checkpoint(tmp_path, 25, manifest=False)
    in_flight = small_checkpoint(tmp_path, 50, manifest=False)
    deleted = prune_checkpoints(tmp_path, keep_last=2, protect=(paths[10],))
    assert sorted(p.name for p in deleted) == ["step_00000020", "step_00000025"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000010", "step_00000030", "step_00000040",
                                                            "step_00000050"]
    assert in_flight.exists() and not crashed.exists()


def test_prune_up_to_a_step_looks_no_further(tmp_path):
    """runmgr's driver prunes up to the newest checkpoint its logbook recorded."""
    for step in (10, 20, 30):
        small_checkpoint(tmp_path, step)
    deleted = prune_checkpoints(tmp_path, keep_last=1, up_to_step=20)
    assert [p.name for p in deleted] == ["step_00000010"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000020", "step_00000030"]


def test_retire_moves_checkpoints_of_an_abandoned_branch_aside(tmp_path):
    for step in (10, 20, 30):
        small_checkpoint(tmp_path, step)
    moved = retire_checkpoints_after(tmp_path, 10, tag="12.03")
    assert [p.name for p in moved] == ["step_00000020.by-12.03", "step_00000030.by-12.03"]
    assert find_latest_verified(tmp_path).step == 10


def test_a_shape_mismatch_names_the_first_tensor_and_counts_the_rest():
    manifest = {"parameters": {"embedding.weight": [256, 64], "blocks.0.attn.qkv.weight": [192, 64],
                               "final_norm.weight": [64]}}
    same = {"embedding.weight": (256, 64), "blocks.0.attn.qkv.weight": (192, 64), "final_norm.weight": (64,)}
    assert shape_mismatch(manifest, same) is None
    wider = {"embedding.weight": [256, 128], "blocks.0.attn.qkv.weight": [384, 128], "final_norm.weight": [128]}
    message = shape_mismatch(manifest, wider)
    assert message is not None and "\n" not in message
    assert "embedding.weight is [256, 64] there, [256, 128] here (and 2 more)" in message
    deeper = {**same, "blocks.1.attn.qkv.weight": [192, 64]}
    assert "blocks.1.attn.qkv.weight is not in the checkpoint" in shape_mismatch(manifest, deeper)


def test_a_manifest_written_before_shapes_were_recorded_has_nothing_to_compare(tmp_path):
    path = small_checkpoint(tmp_path, 4)
    assert recorded_shapes(read_manifest(path)) is None
    assert shape_mismatch(read_manifest(path), {"weight": [1]}) is None
