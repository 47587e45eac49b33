"""Slowdown: throughput well below the run's own baseline."""

from __future__ import annotations

from runmgr.config.watcher import SlowdownConfig
from runmgr.watch.incidents import SLOWDOWN
from runmgr.watch.slowdown import SlowdownDetector


def feed(detector, observations):
    return [i for obs in observations for i in detector.update(obs, obs.time)]


def test_a_40_percent_throughput_drop_is_a_slowdown(trace):
    observations = trace(800, 1)
    slowed = [o if o.step < 500 else type(o)(**{**o.__dict__, "tokens_per_s": o.tokens_per_s * 0.6})
              for o in observations]
    found = feed(SlowdownDetector(SlowdownConfig()), slowed)
    assert [i.kind for i in found] == [SLOWDOWN]
    assert 0.35 < found[0].evidence["drop"] < 0.45
    assert 495 <= found[0].onset_step <= 520


def test_steady_throughput_with_slow_checkpoint_steps_is_not_a_slowdown(trace):
    assert feed(SlowdownDetector(SlowdownConfig()), trace(3000, 2)) == []


def test_speed_falls_back_to_the_step_time():
    from runmgr.watch.observations import StepObservation
    obs = [StepObservation(step=s, time=float(s), step_time=1.0 if s < 300 else 2.0, global_batch=8)
           for s in range(1, 400)]
    found = feed(SlowdownDetector(SlowdownConfig()), obs)
    assert len(found) == 1 and abs(found[0].evidence["drop"] - 0.5) < 1e-9
