"""Checkpoints that fail differently than expected, on real `runmgr launch`
relaunches: a shard that cannot be read, a checkpoint whose data disagree with
its manifest, and a crafted DCP ``.metadata`` whose pickle would run code.
Each is rejected, the previous checkpoint is used, the logbook names the
rejection, and the kept losses are bit for bit those of an uninterrupted run.

One run is stopped once (its driver killed while every rank waits after step
30: checkpoints 10 and 20 verified, the logbook at step 30); each test damages
step 20 of its own copy of that run directory and relaunches it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.harness import LaunchedRun, kept_losses, pause_after, pid_gone, runmgr_json_lines, runmgr_text
from tests.faults.checkpoint_damage import craft_metadata, reader_prefix, rewrite_manifest
from trainer.manifest import DCP_METADATA_NAME, MANIFEST_NAME

pytestmark = pytest.mark.slow

KEEP_ALL = ["checkpoint.keep_last=10"]  # the previous checkpoint must be there to fall back to
STOPPED_AT = 30
DAMAGED, PREVIOUS = "step_00000020", "step_00000010"


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run whose driver was killed while the ranks waited after step 30."""
    run = LaunchedRun(tmp_path_factory.mktemp("ckfaults") / "stopped", extra=[*KEEP_ALL, pause_after(STOPPED_AT)])
    status = run.start().wait_paused(STOPPED_AT)
    run.kill_driver()
    assert all(pid_gone(w["pid"]) for w in status["workers"]), "workers outlived their driver"
    run.release(STOPPED_AT)  # a relaunch must not wait there again
    checkpoints = run.run_dir / "checkpoints"
    assert [p.name for p in sorted(checkpoints.glob("step_*")) if (p / MANIFEST_NAME).is_file()] == [PREVIOUS, DAMAGED]
    return run.run_dir


def copy_of(stopped: Path, tmp_path: Path, name: str) -> Path:
    target = tmp_path / name
    shutil.copytree(stopped, target, symlinks=True)
    return target


def relaunch(run_dir: Path, prefix: list[str] | None = None) -> list[dict]:
    """The same `runmgr launch` again over ``run_dir``, to the end; the logbook's events."""
    run = LaunchedRun(run_dir, extra=KEEP_ALL)
    run.args = [*(prefix or []), *run.args]
    assert run.start().wait() == 0, run.output()[-3000:]
    return runmgr_json_lines("logbook", "events", str(run_dir), "--json")


def rejections(events: list[dict], subrun: str) -> dict[str, str]:
    """``{checkpoint name: reason}`` of the checkpoints ``subrun`` passed over."""
    start = next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == subrun)
    return {Path(path).name: reason for path, reason in start["evidence"]["rejected_checkpoints"]}


def start_of(events: list[dict], subrun: str) -> dict:
    return next(e for e in events if e["type"] == "subrun_start" and e["subrun"] == subrun)


def ends(events: list[dict]) -> dict[str, str]:
    return {e["subrun"]: e["end_state"] for e in events if e["type"] == "subrun_end"}


def test_an_unreadable_shard_is_rejected_and_the_previous_checkpoint_used(stopped_run, tmp_path, reference_losses):
    run_dir = copy_of(stopped_run, tmp_path, "unreadable")
    shard = max((run_dir / "checkpoints" / DAMAGED).glob("*.distcp"), key=lambda p: p.stat().st_size)
    shard.chmod(0)

    events = relaunch(run_dir, reader_prefix())  # as root: without the capabilities that read it anyway

    assert f"file {shard.name} cannot be read (Permission denied)" in rejections(events, "1.01")[DAMAGED]
    assert start_of(events, "1.01")["start_checkpoint"].endswith(PREVIOUS)
    assert ends(events) == {"1.00": "abandoned", "1.01": "finished"}
    assert kept_losses(run_dir) == reference_losses
    timeline = " ".join(runmgr_text("logbook", "show", str(run_dir)).split())  # as read, not as wrapped
    assert f"rejected {DAMAGED}: {DAMAGED}: file {shard.name} cannot be read" in timeline


def test_a_checkpoint_whose_data_disagree_with_its_manifest_is_rejected_once(stopped_run, tmp_path,
                                                                            reference_losses):
    run_dir = copy_of(stopped_run, tmp_path, "inconsistent")
    damaged, previous = run_dir / "checkpoints" / DAMAGED, run_dir / "checkpoints" / PREVIOUS
    for data in [*damaged.glob("*.distcp"), damaged / DCP_METADATA_NAME]:
        data.unlink()
    for data in [*previous.glob("*.distcp"), previous / DCP_METADATA_NAME]:
        shutil.copy2(data, damaged / data.name)  # step 10's data under step 20's manifest ...
    rewrite_manifest(damaged)  # ... whose sizes and hashes now match: only the trainer can tell

    events = relaunch(run_dir)

    # 1.01 starts from step 20, its trainer refuses it; one rejection, no restart storm.
    assert ends(events) == {"1.00": "abandoned", "1.01": "restarting", "1.02": "finished"}
    assert start_of(events, "1.01")["start_checkpoint"].endswith(DAMAGED)
    incident = start_of(events, "1.02")["evidence"]["incident"]
    assert incident["evidence"]["category"] == "checkpoint"
    assert Path(incident["evidence"]["checkpoint"]) == damaged.resolve()
    assert "its data hold step 10, its manifest says 20" in incident["description"]
    assert start_of(events, "1.02")["start_checkpoint"].endswith(PREVIOUS)
    assert DAMAGED in rejections(events, "1.02")
    assert kept_losses(run_dir) == reference_losses
    timeline = " ".join(runmgr_text("logbook", "show", str(run_dir)).split())  # as read, not as wrapped
    assert f"reject checkpoint checkpoints/{DAMAGED}" in timeline and f"rejected {DAMAGED}" in timeline


def test_a_crafted_metadata_is_refused_runs_no_code_and_the_previous_checkpoint_is_used(stopped_run, tmp_path,
                                                                                      reference_losses):
    run_dir = copy_of(stopped_run, tmp_path, "crafted")
    marker = tmp_path / "code-ran"
    craft_metadata(run_dir / "checkpoints" / DAMAGED, marker)  # the manifest vouches for it

    events = relaunch(run_dir)

    assert not marker.exists()
    reason = rejections(events, "1.01")[DAMAGED]
    assert "is not plain DCP metadata: it asks for io.open" in reason and "not code to run" in reason
    assert start_of(events, "1.01")["start_checkpoint"].endswith(PREVIOUS)
    assert ends(events) == {"1.00": "abandoned", "1.01": "finished"}
    assert kept_losses(run_dir) == reference_losses
