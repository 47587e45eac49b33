"""When a node's agent pushes (runmgr/agents/cadence.py): news at once, a quiet node's beat at a
pace one inbox can take from every node together."""

from __future__ import annotations

import pytest

from runmgr.agents.cadence import QUIET_CALLS_PER_S, PushCadence, beat_interval_s


def test_a_small_job_beats_every_push_interval_and_a_large_one_keeps_the_inbox_s_calls_bounded():
    assert beat_interval_s(0.2, 1) == beat_interval_s(0.2, 100) == 0.2
    for nodes in (256, 2048, 16384 // 8, 20000):
        interval = beat_interval_s(0.2, nodes)
        assert nodes / interval <= QUIET_CALLS_PER_S + 1e-9 and interval >= 0.2
    assert beat_interval_s(0.2, 2048) == pytest.approx(4.096)
    # Never past a quarter of the lease its answers renew.
    assert beat_interval_s(0.2, 20000, lease_s=10.0) == 2.5


def test_news_goes_at_once_a_beat_alone_waits_for_its_interval():
    cadence = PushCadence(push_interval_s=0.2, beat_interval_s=4.0)
    assert cadence.due(has_news=False, has_beat=True, now=0.0) == "report"  # the first beat
    cadence.pushed(0.0)
    assert cadence.due(has_news=False, has_beat=True, now=0.2) is None
    assert cadence.due(has_news=True, has_beat=True, now=0.2) == "report"  # a step, an end: no wait
    assert cadence.due(has_news=False, has_beat=True, now=3.0) is None
    assert cadence.due(has_news=False, has_beat=True, now=4.0) == "report"


def test_a_silent_node_still_renews_its_lease():
    cadence = PushCadence(push_interval_s=0.2, beat_interval_s=0.2)
    cadence.pushed(0.0)
    assert cadence.due(has_news=False, has_beat=False, now=0.4) is None
    assert cadence.due(has_news=False, has_beat=False, now=0.8) == "keepalive"  # 4 intervals, as before
    slow = PushCadence(push_interval_s=0.2, beat_interval_s=4.0)
    slow.pushed(0.0)
    assert slow.due(has_news=False, has_beat=False, now=2.0) is None
    assert slow.due(has_news=False, has_beat=False, now=4.0) == "keepalive"


def test_at_a_small_job_s_pace_every_changed_beat_still_goes_each_interval():
    """A wait that ends a hair before its interval does not hold a beat back a whole interval."""
    cadence = PushCadence(push_interval_s=0.2, beat_interval_s=0.2)
    cadence.pushed(10.0)
    assert cadence.due(has_news=False, has_beat=True, now=10.199) == "report"
