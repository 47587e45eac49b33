"""checkpoint_fail: a real read-only mount makes the trainer's own save fail, and goes away."""

from __future__ import annotations

import errno
from dataclasses import replace

import pytest

from runmgr.chaos import storage
from runmgr.chaos.build import build_chaos
from runmgr.chaos.state import ChaosState
from runmgr.config.compose import load_run_config
from runmgr.controller.states import Finished
from tests.runmgr.chaos.conftest import poll_of, running, step_report, worker_of
from tests.runmgr.chaos.test_garbage import Losses, small_config
from trainer.config import CheckpointConfig, DataConfig
from trainer.distributed import DistEnv
from trainer.loop import train


@pytest.fixture
def mountable(tmp_path):
    """Skip where this process may not mount; never leave a mount behind."""
    probe = tmp_path / "probe"
    try:
        storage.make_read_only(str(probe))
    except storage.MountPermissionError:
        pytest.skip("mounting needs CAP_SYS_ADMIN")
    storage.undo_read_only(str(probe))
    yield tmp_path
    for point in storage.mount_points():
        if point.startswith(str(tmp_path)):
            storage.undo_read_only(point)


def test_a_read_only_mount_refuses_new_files_keeps_old_ones_and_is_undone(mountable):
    directory = mountable / "checkpoints"
    (directory / "step_00000010").mkdir(parents=True)
    (directory / "step_00000010" / "manifest.json").write_text("{}")
    storage.make_read_only(str(directory))
    with pytest.raises(OSError) as caught:
        (directory / "step_00000020").mkdir()
    assert caught.value.errno == errno.EROFS
    assert (directory / "step_00000010" / "manifest.json").read_text() == "{}"
    assert storage.undo_read_only(str(directory)) is True
    (directory / "step_00000020").mkdir()
    assert storage.undo_read_only(str(directory)) is False


def test_the_trainers_own_checkpoint_save_fails_with_erofs(mountable):
    save = mountable / "checkpoints"
    storage.make_read_only(str(save))
    config = replace(small_config(DataConfig(corpus_max_bytes=300_000), 4),
                     checkpoint=CheckpointConfig(save=str(save), save_interval=2, async_save=False))
    losses = Losses()
    with pytest.raises(OSError) as caught:
        train(config, reporter=losses, dist_env=DistEnv())
    assert caught.value.errno == errno.EROFS and "Read-only file system" in str(caught.value)
    assert sorted(losses.by_step) == [1, 2], "it trained up to the save, then the write failed"


def test_the_fault_lasts_until_its_sub_run_ends_and_a_relaunch_clears_a_left_over(mountable, sleeper):
    config = load_run_config("demo", [f"run.dir={mountable}", "chaos=checkpoint_fail"])
    save = config.checkpoint_dir().resolve()
    chaos = build_chaos(config)
    seen = []
    injector = chaos.injector(seen.append)
    state = running([worker_of(0, sleeper())])
    injector.on_transition(None, state)
    injector.on_poll(state, poll_of(step_report(30)))
    assert seen[0].kind == "checkpoint_fail" and str(save) in storage.mount_points()
    injector.on_transition(state, Finished("1.00", 31))
    assert str(save) not in storage.mount_points() and ChaosState(mountable).mounts == []
    # A driver killed mid-fault leaves the mount; the next launch's prepare() removes it.
    storage.make_read_only(str(save))
    ChaosState(mountable).add_mount(str(save))
    build_chaos(config).prepare()
    assert str(save) not in storage.mount_points()
