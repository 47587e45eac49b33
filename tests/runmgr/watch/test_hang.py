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


# --- Planned silences: what the sub-run's own plan makes is not a hang ------------------------------

from runmgr.watch.silences import PlannedSilences  # noqa: E402

DEFAULT_BOUNDS = HangConfig()  # the shipped bounds: step 60-1800 s, checkpoint 120-3600 s


def megatron_like(detector: HangDetector, iteration_s: float, steps: range, subrun: str = "1.01") -> float:
    """Every rank beats ``step`` once per iteration (a Megatron job's line); the last beat's time."""
    t = 0.0
    for step in steps:
        t = step * iteration_s
        for rank in (0, 1):
            detector.update(HeartbeatObservation(rank, "step", step, t, "n", subrun), t)
    return t


def test_300_skipped_iterations_at_1_s_each_are_not_a_hang():
    # A rollback asked the job to skip iterations 41-340; Megatron runs each as a silent dummy step.
    detector = HangDetector(DEFAULT_BOUNDS)
    plan = PlannedSilences("1.01", 0.0, skipped=tuple(range(41, 341)), save_interval=1000, final_step=5000)
    detector.expect(plan)
    last = megatron_like(detector, 1.0, range(1, 41))
    assert detector.timeout("step") == 60.0  # without the plan, 60 s of silence would be a hang
    assert detector.check(last + 300.0 + 1.0) == []  # the 300 skips took 300 s: the job is on time
    # The allowance is the plan's, not infinite: silence well past 300 skipped iterations is a hang.
    (hang,) = detector.check(last + detector.limit(HeartbeatObservation(0, "step", 40, last, "n", "1.01")) + 1.0)
    assert hang.kind == HANG and hang.onset_step == 40
    assert "300 skipped iteration(s) the plan makes" in hang.description
    assert hang.evidence["planned_silences"] == ["300 skipped iteration(s)"]


def test_the_same_silence_without_the_plan_is_a_hang():
    detector = HangDetector(DEFAULT_BOUNDS)
    last = megatron_like(detector, 1.0, range(1, 41))
    (hang,) = detector.check(last + 300.0)
    assert hang.kind == HANG


def test_a_silent_stretch_of_skips_is_not_learned_as_a_step_duration():
    detector = HangDetector(DEFAULT_BOUNDS)
    detector.expect(PlannedSilences("1.01", 0.0, skipped=tuple(range(11, 41))))
    megatron_like(detector, 1.0, range(1, 11))
    for rank in (0, 1):  # iteration 41, 31 s after iteration 10
        detector.update(HeartbeatObservation(rank, "step", 41, 41.0, "n", "1.01"), 41.0)
    assert detector.timeout("step") == 60.0  # 5 x 1 s, clamped up; not 5 x 31 s


def test_skips_right_after_the_start_checkpoint_widen_the_init_window():
    detector = HangDetector(DEFAULT_BOUNDS)
    megatron_like(detector, 1.0, range(1, 30), subrun="1.00")  # the lineage's measured iteration: 1 s
    fresh = detector.for_new_subrun()
    fresh.expect(PlannedSilences("1.01", 100.0, skipped=tuple(range(31, 61))))
    for rank in (0, 1):  # loaded checkpoint 30: the next 30 iterations are skipped
        fresh.update(HeartbeatObservation(rank, "init", 30, 100.0, "n", "1.01"), 100.0)
    init = fresh.timeout("init")
    assert fresh.check(100.0 + init + 30 * 1.0) == []
    assert fresh.check(100.0 + init + 30 * 5.0 + 1.0) != []


def test_a_finished_rank_is_never_waited_for_again_and_the_final_save_is_expected():
    detector = HangDetector(DEFAULT_BOUNDS)
    detector.expect(PlannedSilences("1.00", 0.0, final_step=40, save_interval=10))
    last = megatron_like(detector, 1.0, range(1, 41), subrun="1.00")
    detector.finish(1)  # rank 1 exited 0 after the last iteration
    # A line of rank 0's node would beat rank 1 too (it speaks for the ranks still running): ignored.
    detector.update(HeartbeatObservation(1, "step", 40, last + 1, "n", "1.00"), last + 1)
    # Rank 0 saves and tears down: the final save's allowance covers it ...
    assert detector.check(last + 60.0 + 100.0) == []
    # ... and when rank 0 is silent past it, only rank 0 is named.
    (hang,) = detector.check(last + 60.0 + detector.timeout("checkpoint") + 1.0)
    assert hang.ranks == (0,) and "the final save and the job's teardown" in hang.description


def test_an_evaluation_every_eval_interval_is_expected():
    detector = HangDetector(DEFAULT_BOUNDS)
    detector.expect(PlannedSilences("1.00", 0.0, eval_interval=20, eval_iters=100, final_step=1000))
    last = megatron_like(detector, 1.0, range(1, 21), subrun="1.00")
    assert detector.check(last + 100.0) == []  # 100 forward passes after iteration 20
    last = megatron_like(detector, 1.0, range(21, 22), subrun="1.00")
    assert detector.check(last + 100.0) != []  # after iteration 21 there is no evaluation


def test_durations_are_the_lineage_s_across_sub_runs():
    detector = HangDetector(HangConfig(safety_factor=5.0, step=PhaseTimeout(600.0, 1.0, 1800.0)))
    beats(detector, 0, "step", [0.0, 2.0, 4.0])
    assert detector.for_new_subrun().timeout("step") == 10.0


def test_a_polls_beats_are_taken_together_so_a_late_beat_in_the_batch_is_no_silence():
    from runmgr.config.watcher import WatcherConfig
    from runmgr.watch.watcher import Watcher

    watcher = Watcher(WatcherConfig(hang=HangConfig(step=PhaseTimeout(5.0, 5.0, 5.0))))
    first = [HeartbeatObservation(rank, "step", 1, 0.0, "node-a", "1.00") for rank in range(3)]
    assert watcher.observe_all(first, 0.0) == []
    # A driver that polls late: rank 0's beat of step 2 comes before ranks 1 and 2's in the batch,
    # at a moment when their step-1 beats are older than the timeout. Neither is silent.
    late = [HeartbeatObservation(rank, "step", 2, 4.0, "node-a", "1.00") for rank in range(3)]
    assert watcher.observe_all(late, 6.0) == []
    # Rank 2 then falls silent; the others beat on: one incident, rank 2's.
    on = [HeartbeatObservation(rank, "step", 3, 8.0, "node-a", "1.00") for rank in (0, 1)]
    assert [i.ranks for i in watcher.observe_all(on, 9.5)] == [(2,)]


def node_beat(rank, step, time, node, subrun="1.00"):
    """A node agent's summary: its laggard rank's last beat, standing for the node."""
    return HeartbeatObservation(rank, "step", step, time, node, subrun, for_node=True)


def test_a_nodes_beats_are_watched_per_node_and_a_silence_names_its_laggard_rank():
    detector = HangDetector(HangConfig(safety_factor=2.0, step=PhaseTimeout(600.0, 1.0, 1800.0)))
    # Two nodes of 4 ranks: a node's laggard changes from step to step (rank 1, then 2, then 1).
    for step, (a, b) in enumerate([(0, 4), (1, 5), (2, 4), (1, 6)], start=1):
        t = 10.0 * step
        assert detector.update(node_beat(a, step, t, "node-a"), t) == []
        assert detector.update(node_beat(b, step, t, "node-b"), t) == []
    # An old laggard (rank 0, 2 or 5) is no silence, and no gap is learned across laggards.
    assert detector.timeout("step") == 600.0
    assert detector.check(55.0) == []
    # Node b's laggard, rank 7, stops; node a goes on (its laggard rank 1 now: 10 s steps learned).
    detector.update(node_beat(7, 5, 50.0, "node-b"), 50.0)
    for step in (5, 6, 7, 8):
        detector.take(node_beat(1, step, 10.0 * step, "node-a"))
    [hang] = detector.check(80.0)
    assert hang.ranks == (7,) and hang.nodes == ("node-b",)
    assert hang.description.startswith("1 node(s) silent in phase step: rank 7 for 30.0 s")


def test_a_node_whose_ranks_all_finished_is_no_longer_waited_for():
    detector = HangDetector(HangConfig(safety_factor=2.0, step=PhaseTimeout(600.0, 1.0, 1800.0)))
    for step in (1, 2, 3):
        detector.update(node_beat(3, step, 10.0 * step, "node-a"), 10.0 * step)
        detector.update(node_beat(4, step, 10.0 * step, "node-b"), 10.0 * step)
    for rank in (0, 1, 2):  # not the laggard: the node is still watched
        detector.finish(rank)
    detector.update(node_beat(4, 4, 40.0, "node-b"), 40.0)
    detector.finish(3)  # the node's last beat was rank 3's, and rank 3 finished
    for step in (5, 6, 7):
        detector.update(node_beat(4, step, 10.0 * step, "node-b"), 10.0 * step)
    assert detector.check(75.0) == []
