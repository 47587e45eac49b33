"""Which steps the text of ``runmgr logbook compare`` shows of a long comparison."""

from logbook.compare_text import AROUND, MAX_ROWS, shown_steps


def test_a_short_comparison_shows_every_step():
    assert shown_steps(list(range(1, 31)), None) == list(range(1, 31))


def test_a_long_comparison_shows_spread_rows_the_ends_and_the_verdict_step_with_its_neighbours():
    steps = list(range(1, 1001))
    shown = shown_steps(steps, 503)
    assert shown[0] == 1 and shown[-1] == 1000 and shown == sorted(set(shown))
    assert set(range(503 - AROUND, 503 + AROUND + 1)) <= set(shown)
    assert MAX_ROWS <= len(shown) <= MAX_ROWS + 2 * AROUND + 1
