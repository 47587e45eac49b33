"""Hangs: per-phase heartbeat timeouts learned from observed durations, clamped."""

from __future__ import annotations

from runmgr.config.watcher import HangConfig, PhaseTimeout
from runmgr.watch.hang import HangDetector
from runmgr.watch.incidents import HANG
from runmgr.watch.observations import HeartbeatObservation


def beats(detector, rank, phase, times, step0=1, node="node-a", subrun="1.00"):
    found = []
    for i, t in enumerate(times):
        found += detector.update(HeartbeatObservation(rank, phase, step0 + i, t, node, subrun), t)
    return found


def test_timeout_is_learned_from_durations_times_the_safety_factor():
    detector = HangDetector(HangConfig(safety_factor=5.0, step=PhaseTimeout(600.0, 1.0, 1800.0)))
    assert detector.timeout("step") == 600.0  # nothing observed: the initial value
    beats(detector, 0, "step", [0.0, 2.0, 4.5, 6.5])  # durations 2.0, 2.5, 2.0
    assert detector.timeout("step") == 5.0 * 2.5


def test_learned_timeout_is_clamped_to_the_phase_bounds():
    fast = HangDetector(HangConfig(safety_factor=5.0, step=PhaseTimeout(600.0, 60.0, 1800.0)))
    beats(fast, 0, "step", [0.0, 0.1, 0.2])
    assert fast.timeout("step") == 60.0
    slow = HangDetector(HangConfig(safety_factor=5.0, step=PhaseTimeout(600.0, 60.0, 1800.0)))
    beats(slow, 0, "step", [0.0, 500.0])
    assert slow.timeout("step") == 1800.0


def test_each_phase_learns_its_own_duration():
    detector = HangDetector(HangConfig(safety_factor=3.0, step=PhaseTimeout(600.0, 1.0, 1800.0),
                                       checkpoint=PhaseTimeout(900.0, 1.0, 3600.0)))
    detector.update(HeartbeatObservation(0, "step", 1, 0.0), 0.0)
    detector.update(HeartbeatObservation(0, "checkpoint", 1, 1.0), 1.0)
    detector.update(HeartbeatObservation(0, "step", 2, 41.0), 41.0)  # the checkpoint took 40 s
    assert detector.timeout("step") == 3.0 and detector.timeout("checkpoint") == 120.0


def test_a_silent_rank_is_reported_once_past_its_timeout_with_the_numbers():
    detector = HangDetector(HangConfig(safety_factor=5.0, step=PhaseTimeout(600.0, 10.0, 1800.0)))
    for t in range(0, 40, 2):
        for rank in range(4):
            detector.update(HeartbeatObservation(rank, "step", t // 2, float(t), f"node-{rank // 2}"), float(t))
    # Ranks 1 and 3 stop beating at t=38; the others go on.
    for t in range(40, 48, 2):
        for rank in (0, 2):
            detector.update(HeartbeatObservation(rank, "step", t // 2, float(t), f"node-{rank // 2}"), float(t))
    assert detector.check(47.9) == []  # 9.9 s of silence < 10 s (the clamp)
    found = detector.check(48.5)
    assert len(found) == 1
    hang = found[0]
    assert hang.kind == HANG and hang.ranks == (1, 3) and hang.nodes == ("node-0", "node-1")
    assert hang.onset_step == 19
    assert hang.evidence["silent"][0]["timeout_s"] == 10.0
    assert "timeout 10.0 s" in hang.description
    # Later, the other ranks fall silent too: only they are new; 1 and 3 are not reported again.
    assert [i.ranks for i in detector.check(100.0)] == [(0, 2)]


def test_a_new_heartbeat_rearms_the_rank():
    detector = HangDetector(HangConfig(step=PhaseTimeout(5.0, 5.0, 5.0)))
    detector.update(HeartbeatObservation(0, "step", 1, 0.0), 0.0)
    assert len(detector.check(6.0)) == 1
    detector.update(HeartbeatObservation(0, "step", 2, 7.0), 7.0)
    assert detector.check(11.0) == [] and len(detector.check(13.0)) == 1


def test_ranks_of_an_ended_subrun_are_forgotten():
    detector = HangDetector(HangConfig(init=PhaseTimeout(50.0, 50.0, 50.0), step=PhaseTimeout(5.0, 5.0, 5.0)))
    detector.update(HeartbeatObservation(0, "step", 1, 0.0, subrun="1.00"), 0.0)
    detector.update(HeartbeatObservation(1, "step", 1, 0.0, subrun="1.00"), 0.0)
    detector.update(HeartbeatObservation(0, "init", 0, 3.0, subrun="1.01"), 3.0)
    assert detector.check(20.0) == []  # rank 1 of 1.00 is gone; rank 0 is in init (50 s)


def test_forget_stops_watching_a_finished_rank():
    detector = HangDetector(HangConfig(step=PhaseTimeout(5.0, 5.0, 5.0)))
    detector.update(HeartbeatObservation(0, "step", 1, 0.0), 0.0)
    detector.forget(0)
    assert detector.check(60.0) == []
