"""Where a sub-run starts: the newest checkpoint that verifies in full (a
crafted DCP metadata does not), with the reason for each one passed over."""

from __future__ import annotations

from pathlib import Path

import pytest

from runmgr.resume import find_resume_point
from tests.faults.checkpoint_damage import craft_metadata, small_checkpoint

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

