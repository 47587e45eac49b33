"""Plain data parallel's warm copy is the replicas' live state (trainer/live.py): where the
re-formed group resumes, who sends, who receives, and which step reports go again."""

from __future__ import annotations

import pytest

from trainer.live import Committed, live_agreement
from trainer.report import StepReport


def report(step: int) -> StepReport:
    return StepReport("1.00", step, 2.0, 1.0, 1e-3, 1.0, 64, 4 * step, 0.1, (0.05, 0.05), False, 0.0)


def test_the_group_resumes_at_the_newest_step_a_survivor_holds_and_its_lowest_holder_sends():
    # Rank 1 completed step 12's collectives before its peer died, rank 0 had not; rank 2 is new.
    agreed = live_agreement([11, 12, -1])
    assert (agreed.step, agreed.donor, agreed.receivers) == (12, 1, (0, 2))


def test_survivors_at_the_same_step_send_only_to_the_replacement():
    agreed = live_agreement([-1, 7, 7, 7])
    assert (agreed.step, agreed.donor, agreed.receivers) == (7, 1, (0,))


def test_survivors_two_steps_apart_are_refused():
    with pytest.raises(RuntimeError, match="more than one step apart"):
        live_agreement([5, 7, -1])


def test_a_group_of_replacements_alone_holds_nothing():
    with pytest.raises(RuntimeError, match="no live state"):
        live_agreement([-1, -1])


def test_the_steps_the_driver_has_not_recorded_are_reported_again_and_no_others():
    committed = Committed(0, 0, 0)
    for step in range(1, 8):
        committed.commit(step, 4 * step, 0, report(step))
    assert [r.step for r in committed.reports_after(5)] == [6, 7]
    assert committed.reports_after(None) == []  # no bound given: nothing is missing
    assert len(committed.reports) == 4  # only the last few are kept
