"""A bounded command whose deadline counts from its first line: a slow start is not a hang."""

from __future__ import annotations

import sys

from health.probes.bounded import run_bounded_from_first_line

# The child is told how long to wait by the test, never timed against the machine: it sleeps
# far past or far short of the limits it is given, so a loaded machine cannot flip the verdict.
SLOW_START = "import time, sys; time.sleep({}); print('step', flush=True); {}"


def test_the_deadline_counts_from_the_first_line_not_from_the_start():
    # Silent for 2 s (its "start": twice the deadline, and a loaded machine only makes it longer),
    # then done at once: inside a 1 s deadline counted from the line.
    run = run_bounded_from_first_line(
        [sys.executable, "-c", SLOW_START.format(2, "print('done')")], timeout_s=1.0, start_s=60.0)
    assert run.status == "ok" and run.stdout.splitlines() == ["step", "done"]
    assert run.seconds >= 2


def test_a_command_hung_after_its_first_line_is_stopped_with_what_it_printed():
    run = run_bounded_from_first_line(
        [sys.executable, "-c", SLOW_START.format(0, "time.sleep(600)")], timeout_s=1.0, start_s=60.0)
    assert run.status == "timeout" and run.stdout == "step\n" and run.seconds < 60


def test_a_command_silent_past_its_start_allowance_is_stopped_with_no_output():
    run = run_bounded_from_first_line(
        [sys.executable, "-c", SLOW_START.format(600, "")], timeout_s=60.0, start_s=1.0)
    assert run.status == "timeout" and run.stdout == "" and run.seconds < 60


def test_a_command_that_fails_before_printing_is_a_failure_with_its_error():
    run = run_bounded_from_first_line(
        [sys.executable, "-c", "import sys; sys.exit('no such mount')"], timeout_s=60.0, start_s=60.0)
    assert run.status == "failed" and run.returncode == 1 and "no such mount" in run.stderr
