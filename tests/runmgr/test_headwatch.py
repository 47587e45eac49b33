"""The head watch: a GCS silent for the timeout, or a local GCS process that
exited, is a lost head; an answer renews the time it was last heard from."""

from __future__ import annotations

import pytest

from runmgr.errors import ClusterLostError
from runmgr.headwatch import HeadWatch


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_gcs_silent_for_the_timeout_is_a_lost_head_and_an_answer_renews_it():
    clock, answers = Clock(), [True]
    watch = HeadWatch("10.0.0.1:6379", lambda timeout_s: answers[-1], lost_after_s=20, clock=clock)
    clock.now += 19
    watch.probe_once()
    clock.now += 19  # 38 s since start, but it answered 19 s ago
    assert watch.lost() is None
    answers.append(False)
    watch.probe_once()
    clock.now += 2
    with pytest.raises(ClusterLostError) as caught:
        watch.check()
    message = str(caught.value)
    assert "10.0.0.1:6379 has not answered for 21 s (controller.cluster_lost_timeout_s=20)" in message
    assert "once it answers again, run the same `runmgr launch`" in message and "\n" not in message


def test_a_local_gcs_process_that_exited_is_a_lost_head_at_once():
    exited = [None]
    watch = HeadWatch("127.0.0.1:6379", lambda timeout_s: True, lost_after_s=20, head_exit=lambda: exited[-1],
                      clock=Clock())
    watch.check()
    exited.append("(pid 42) was killed by signal 9")
    with pytest.raises(ClusterLostError, match=r"its GCS process \(pid 42\) was killed by signal 9; run the same"):
        watch.check()


def test_a_probe_never_waits_longer_than_half_the_timeout():
    asked = []
    watch = HeadWatch("h:1", lambda timeout_s: asked.append(timeout_s) or True, lost_after_s=3, clock=Clock())
    watch.probe_once()
    assert asked == [1.5]
