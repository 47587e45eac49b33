"""Where a sub-run starts: the newest checkpoint that verifies in full (a
crafted DCP metadata does not), with the reason for each one passed over."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runmgr.resume import RemoteUnavailable, find_resume_point, listed_checkpoints, resume_at
from tests.faults.checkpoint_damage import craft_metadata, small_checkpoint
from trainer.manifest import MANIFEST_NAME, checkpoint_dir, list_checkpoints, read_manifest, step_of, verify_checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def test_a_crafted_checkpoint_is_passed_over_for_the_previous_one_with_its_reason(tmp_path):
    for step in (10, 20):
        small_checkpoint(tmp_path, step)
    marker = tmp_path / "code-ran"
    craft_metadata(small_checkpoint(tmp_path, 30), marker)
    point = find_resume_point(tmp_path, max_step=30)
    assert (Path(point.path).name, point.step) == ("step_00000020", 20)
    ((path, reason),) = point.rejected
    assert Path(path).name == "step_00000030" and "it asks for io.open" in reason
    assert not marker.exists()



class FolderRemote:
    """A durable copy of the checkpoints in a folder (what the S3 mirror is to a resume)."""

    location = "s3://bucket/run"

    def __init__(self, root: Path, broken: tuple[int, ...] = ()) -> None:
        self.root, self.broken, self.fetched = root, broken, []

    def complete_steps(self) -> list[int]:
        return sorted(step_of(p) for p in list_checkpoints(self.root) if (p / MANIFEST_NAME).is_file())

    def consumed_samples(self, step: int):
        return read_manifest(checkpoint_dir(self.root, step))["consumed_samples"]

    def fetch(self, step: int, save_dir: Path) -> Path:
        self.fetched.append(step)
        if step in self.broken:
            raise RemoteUnavailable("Could not connect to the endpoint URL")
        target = checkpoint_dir(save_dir, step)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(checkpoint_dir(self.root, step), target)
        return target


def test_a_missing_local_checkpoint_is_fetched_from_the_durable_copy(tmp_path):
    remote = FolderRemote(tmp_path / "s3")
    for step in (10, 20):
        small_checkpoint(remote.root, step)
    local = tmp_path / "checkpoints"  # deleted, or a fresh machine
    point = find_resume_point(local, max_step=25, remote=remote)
    assert (point.step, point.fetched_from, remote.fetched) == (20, "s3://bucket/run/step_00000020", [20])
    assert Path(point.path) == checkpoint_dir(local, 20) and verify_checkpoint(point.path)[0]


def test_a_local_checkpoint_that_fails_is_replaced_by_its_copy_and_a_copy_that_cannot_come_falls_back(tmp_path):
    remote = FolderRemote(tmp_path / "s3", broken=(30,))
    local = tmp_path / "checkpoints"
    for step in (10, 20, 30):
        small_checkpoint(remote.root, step)
        small_checkpoint(local, step)
    for step in (20, 30):  # damaged on the local disk
        next(checkpoint_dir(local, step).glob("*.distcp")).write_bytes(b"garbage")
    point = find_resume_point(local, max_step=30, remote=remote)
    assert (point.step, remote.fetched) == (20, [30, 20]) and verify_checkpoint(point.path)[0]
    reasons = dict(point.rejected)
    assert "is 7 bytes" in reasons[str(checkpoint_dir(local, 30))]
    assert "Could not connect" in reasons["s3://bucket/run/step_00000030"]


def test_the_policy_may_choose_a_checkpoint_only_the_durable_copy_holds(tmp_path):
    remote = FolderRemote(tmp_path / "s3")
    for step in (10, 20, 30):
        small_checkpoint(remote.root, step)
    local = tmp_path / "checkpoints"
    small_checkpoint(local, 30)  # retention deleted 10 and 20 once their copies verified
    listed = listed_checkpoints(local, max_step=25, remote=remote)
    assert [(c.step, c.consumed_samples) for c in listed] == [(10, 80), (20, 160)]
    assert remote.fetched == []


def megatron_save_dir(tmp_path: Path, saved: tuple[int, ...], tracker: int) -> Path:
    """A real Megatron-LM job's --save folder: iter_NNNNNNN folders and its tracker file."""
    for step in saved:
        folder = tmp_path / f"iter_{step:07d}"
        folder.mkdir()
        (folder / "common.pt").write_bytes(b"weights")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text(f"{tracker}\n")
    return tmp_path


def test_a_real_megatron_jobs_checkpoints_count_up_to_its_tracker(tmp_path):
    # 30 was being written when the job died: Megatron had not yet moved its tracker past 20.
    save = megatron_save_dir(tmp_path, (10, 20, 30), tracker=20)
    assert [c.step for c in listed_checkpoints(save, max_step=100)] == [10, 20]
    point = resume_at(save, 25, "the last step the driver recorded")
    assert (point.path, point.step) == (str(save / "iter_0000020"), 20)
    earlier = resume_at(save, 15, "the checkpoint rollback_skip names")
    assert earlier.step == 10 and earlier.rejected[0][0] == str(save / "iter_0000020")


def test_a_folder_without_megatrons_tracker_holds_no_megatron_checkpoint(tmp_path):
    save = megatron_save_dir(tmp_path, (10,), tracker=10)
    (save / "latest_checkpointed_iteration.txt").unlink()
    assert listed_checkpoints(save, max_step=100) == [] and resume_at(save, 50, "limit").path is None
