"""A recorded log's lines at the times the job wrote them, and a source that gives a follower the
lines written by the player's clock."""

from __future__ import annotations

import re

from runmgr.score.timeline import PlayedLog, step_times, timed_lines
from tests.runmgr.score.played_logs import START, STEP_S, Log
from tests.runmgr.shadow.megatron_lines import iteration_line


def unstamped(iteration: int, step_ms: float = 2000.0) -> str:
    return re.sub(r" \[[^]]*\]", "", iteration_line(iteration, 2.5, step_ms=step_ms))


def test_stamped_lines_are_at_their_stamps_and_the_lines_between_at_the_one_before():
    log = Log().train(range(1, 4))
    timed = timed_lines(log.lines)
    assert [at for at, _ in timed] == [START + STEP_S, START + 2 * STEP_S, START + 3 * STEP_S]
    log = Log().train(range(49, 52))  # the save's two lines come after iteration 50's
    assert [at - START for at, _ in timed_lines(log.lines)] == [10.0, 20.0, 20.0, 20.0, 30.0]


def test_unstamped_iterations_add_their_elapsed_times_after_megatron_s_print_datetime():
    lines = ["[after model, optimizer, and learning rate scheduler are built] datetime: 2024-09-03 14:00:00 ",
             unstamped(1), unstamped(11), "a line without a time",
             "[after dataloaders are built] datetime: 2024-09-03 15:00:00 ", unstamped(12)]
    at = [t for t, _ in timed_lines(lines)]
    t0 = 1725372000.0
    assert at[:4] == [t0, t0 + 2.0, t0 + 22.0, t0 + 22.0]  # 10 iterations of 2 s between the two lines
    assert at[4:] == [t0 + 3600.0, t0 + 3602.0]


def test_time_never_goes_back():
    log = Log().train(range(1, 3))
    lines = [log.lines[1], log.lines[0]]
    assert [at for at, _ in timed_lines(lines)] == [START + 2 * STEP_S] * 2


def test_a_played_log_gives_the_lines_written_by_its_clock_and_each_iteration_s_time():
    timed = timed_lines(Log().train(range(1, 6)).lines)
    source = PlayedLog(timed, "train.log", now=START)
    assert source.take() == [] and source.next_line_at() == START + STEP_S
    source.now = START + 2.5 * STEP_S
    assert [line for _, line in source.take()] == [line for _, line in timed[:2]]
    assert source.position() == {"line": 2} and source.next_line_at() == START + 3 * STEP_S
    assert step_times(timed) == {i: START + i * STEP_S for i in range(1, 6)}


def test_a_preamble_before_the_log_s_first_time_is_at_that_time_not_at_1970():
    log = Log().train(range(1, 3))
    timed = timed_lines(["using world size: 64, data-parallel size: 8", "training ...", *log.lines])
    assert [at for at, _ in timed] == [START + STEP_S, START + STEP_S, START + STEP_S, START + 2 * STEP_S]
