"""The end of a sub-run whose ranks all exited 0: finished at the last step, else an early exit."""

from __future__ import annotations

from runmgr.watch.ending import EndDetector
from runmgr.watch.incidents import EARLY_EXIT
from runmgr.watch.observations import JobEnded


def test_reaching_the_last_step_is_no_incident():
    assert EndDetector().update(JobEnded("1.00", 5.0, last_step=150, final_step=150), 5.0) == []


def test_exit_0_before_the_last_step_is_an_early_exit_that_says_what_it_saved():
    (incident,) = EndDetector().update(
        JobEnded("1.00", 5.0, last_step=25, final_step=150, start_step=0, newest_checkpoint=20, steps_reported=25,
                 output=("iteration 25/150 |",)), 5.0)
    assert incident.kind == EARLY_EXIT and incident.onset_step == 25
    assert incident.evidence["saved_since_start"] is True and incident.evidence["last_output"] == ["iteration 25/150 |"]
    assert "a save at step 20" in incident.description


def test_a_job_that_never_printed_an_iteration_line_says_so():
    (incident,) = EndDetector().update(JobEnded("1.00", 5.0, last_step=0, final_step=150), 5.0)
    assert incident.evidence["saved_since_start"] is False and incident.evidence["steps_reported"] == 0
    assert "without printing a single iteration line" in incident.description
