"""Retention is the driver's: once the logbook recorded checkpoint N it deletes
what the lineage no longer needs before N, never N, never anything newer,
never the checkpoint a rollback decided now would go back to. The checkpoints
are real torch.distributed.checkpoint directories with manifests."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.config.compose import load_run_config
from runmgr.controller.group import GroupPoll
from runmgr.controller.states import Launching, Running
from runmgr.observers.retention import RetentionObserver, rollback_reach_steps, trainer_keeps_everything
from tests.runmgr.controller.fakes import step_report
from tests.faults.checkpoint_damage import small_checkpoint
from trainer.manifest import list_checkpoints
from trainer.plan import ResumePlan
from trainer.report import CheckpointReport

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

RUNNING = Running("1.00", ResumePlan(subrun="1.00"), 0)


def steps_on_disk(save_dir: Path) -> list[str]:
    return [path.name[5:].lstrip("0") for path in list_checkpoints(save_dir)]


def recorded(save_dir: Path, step: int, last_step: int | None = None) -> GroupPoll:
    """A poll in which the logbook records checkpoint ``step`` and the steps up to ``last_step``."""
    report = CheckpointReport("1.00", step, str(save_dir / f"step_{step:08d}"), 0.1, 0.0)
    return GroupPoll(steps=[step_report(s) for s in range(1, (last_step or step) + 1)], checkpoints=[report])


def test_after_recording_a_checkpoint_the_driver_keeps_the_newest_ones_up_to_it_and_nothing_newer_is_touched(tmp_path):
    for step in (10, 20, 30, 40):
        small_checkpoint(tmp_path, step)
    small_checkpoint(tmp_path, 25, manifest=False)  # a save that never finished
    small_checkpoint(tmp_path, 50)  # committed, not recorded yet (the driver has not drained it)
    small_checkpoint(tmp_path, 60, manifest=False)  # in flight
    retention = RetentionObserver(tmp_path, keep_last=2, rollback_reach=0)
    retention.on_poll(RUNNING, recorded(tmp_path, 40))
    assert steps_on_disk(tmp_path) == ["30", "40", "50", "60"]
    assert [p.name for p in retention.deleted] == ["step_00000010", "step_00000020", "step_00000025"]


def test_the_newest_recorded_checkpoint_stays_whatever_is_newer_on_disk(tmp_path):
    for step in (10, 20, 30):
        small_checkpoint(tmp_path, step)
    retention = RetentionObserver(tmp_path, keep_last=1, rollback_reach=0)
    retention.on_poll(RUNNING, recorded(tmp_path, 20))  # 30 was committed by ranks the driver has not heard
    assert steps_on_disk(tmp_path) == ["20", "30"]


def test_the_checkpoint_a_rollback_decided_now_goes_back_to_is_kept(tmp_path):
    for step in (10, 20, 30, 40, 50):
        small_checkpoint(tmp_path, step)
    # Recorded up to step 52; a spike with its onset up to 25 steps back rolls back a
    # further 10: to the newest checkpoint at or before step 17.
    retention = RetentionObserver(tmp_path, keep_last=1, rollback_reach=35)
    retention.on_poll(RUNNING, recorded(tmp_path, 50, last_step=52))
    assert steps_on_disk(tmp_path) == ["10", "50"]


def test_keep_last_zero_keeps_every_checkpoint(tmp_path):
    for step in (10, 20, 30):
        small_checkpoint(tmp_path, step)
    RetentionObserver(tmp_path, keep_last=0, rollback_reach=0).on_poll(RUNNING, recorded(tmp_path, 30))
    assert steps_on_disk(tmp_path) == ["10", "20", "30"]


def test_a_rollback_counts_recorded_steps_from_where_the_new_subrun_starts(tmp_path):
    for step in (10, 20, 30):
        small_checkpoint(tmp_path, step)
    retention = RetentionObserver(tmp_path, keep_last=1, rollback_reach=15)
    retention.on_poll(RUNNING, GroupPoll(steps=[step_report(s) for s in range(1, 61)]))
    retention.on_transition(RUNNING, Launching("1.01", ResumePlan(subrun="1.01"), 20, "rollback"))
    retention.on_poll(RUNNING, recorded(tmp_path, 30, last_step=35))  # 35 - 15: step 20 is the target
    assert steps_on_disk(tmp_path) == ["20", "30"]


def test_under_runmgr_the_trainer_deletes_nothing_and_the_reach_follows_policy_and_watcher(tmp_path):
    config = load_run_config("demo", [f"run.dir={tmp_path}", "checkpoint.keep_last=2", "policy.rollback.margin_steps=7",
                                      "watcher.loss_spike.grace_steps=5", "watcher.grad_spike.grace_steps=9"])
    trainer = trainer_keeps_everything(config.trainer_config())
    assert trainer.checkpoint.keep_last == 0 and config.checkpoint.keep_last == 2
    assert trainer.checkpoint.save == config.trainer_config().checkpoint.save
    assert rollback_reach_steps(config) == 7 + 9
