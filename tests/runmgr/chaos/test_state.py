"""chaos_state.json: what a relaunched driver must not do again."""

from __future__ import annotations

import pytest

from runmgr.chaos.state import STATE_FILE, ChaosState, ChaosStateError


def test_fired_faults_mounts_and_the_intended_lr_survive_a_new_reader(tmp_path):
    state = ChaosState(tmp_path)
    state.mark_fired("0:kill_worker@25", {"step": 25})
    state.add_mount("/runs/demo/checkpoints")
    assert state.remember_intended_lr(3e-3) == 3e-3
    again = ChaosState(tmp_path)
    assert again.has_fired("0:kill_worker@25") and not again.has_fired("1:hang_rank@45")
    assert again.mounts == ["/runs/demo/checkpoints"]
    assert again.remember_intended_lr(0.9) == 3e-3, "a relaunch's config carries the mistaken LR"
    again.remove_mount("/runs/demo/checkpoints")
    assert ChaosState(tmp_path).mounts == []
    assert [p.name for p in tmp_path.iterdir()] == [STATE_FILE], "no temporary file left behind"


def test_an_unreadable_state_file_is_one_line_that_says_what_to_do(tmp_path):
    (tmp_path / STATE_FILE).write_text('{"fired": {')
    with pytest.raises(ChaosStateError) as caught:
        ChaosState(tmp_path)
    message = str(caught.value)
    assert "chaos_state.json cannot be read" in message and "delete it" in message and "\n" not in message
