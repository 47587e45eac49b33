"""Stragglers: one slow rank among eight."""

from __future__ import annotations

import random

from runmgr.config.watcher import StragglerConfig
from runmgr.watch.incidents import STRAGGLER
from runmgr.watch.observations import RankTimings, StepObservation
from runmgr.watch.stragglers import StragglerDetector

NODES = {rank: f"node-{rank // 4}" for rank in range(8)}


def steps(n, seed, slow=None, factor=1.5, from_step=1, subrun="1.00"):
    rng = random.Random(seed)
    out = []
    for step in range(1, n + 1):
        times = [0.40 * (1 + rng.gauss(0, 0.05)) for _ in range(8)]
        if slow is not None and step >= from_step:
            times[slow] *= factor
        out.append(StepObservation(step=step, time=float(step), subrun=subrun, compute_times=tuple(times)))
    return out


def feed(detector, observations):
    return [i for obs in observations for i in detector.update(obs, obs.time)]


def test_one_slow_rank_among_eight_is_named_with_its_node():
    found = feed(StragglerDetector(StragglerConfig(), NODES), steps(200, 1, slow=5, from_step=100))
    assert len(found) == 1
    straggler = found[0]
    assert straggler.kind == STRAGGLER and straggler.ranks == (5,) and straggler.nodes == ("node-1",)
    assert 1.4 < straggler.evidence["ranks"]["5"]["median_ratio"] < 1.6
    assert 100 <= straggler.onset_step <= 120


def test_ranks_with_ordinary_jitter_are_not_stragglers():
    assert feed(StragglerDetector(StragglerConfig(), NODES), steps(2000, 2)) == []


def test_a_rank_slow_only_now_and_then_is_not_a_straggler():
    rng = random.Random(3)
    noisy = [StepObservation(step=o.step, time=o.time, compute_times=tuple(
        t * (1.5 if r == 2 and rng.random() < 0.3 else 1.0) for r, t in enumerate(o.compute_times)))
        for o in steps(500, 3)]
    assert feed(StragglerDetector(StragglerConfig(), NODES), noisy) == []


def test_a_new_subrun_starts_the_count_afresh():
    detector = StragglerDetector(StragglerConfig(), NODES)
    assert len(feed(detector, steps(60, 4, slow=1))) == 1
    assert len(feed(detector, steps(60, 5, slow=1, subrun="1.01"))) == 1


def test_the_onset_is_where_the_slowness_began_not_an_earlier_noisy_step():
    observations = steps(60, 6, slow=3, factor=2.0, from_step=30)
    noisy = observations[25]  # step 26: one slow step on rank 3 before the straggling began
    times = list(noisy.compute_times)
    times[3] *= 2.0
    observations[25] = StepObservation(step=noisy.step, time=noisy.time, compute_times=tuple(times))
    (straggler,) = feed(StragglerDetector(StragglerConfig(), NODES), observations)
    assert straggler.onset_step == 30


def timings(n, slowest, fastest=0, slow_ms=1500.0, fast_ms=1000.0, subrun="1.00"):
    """Megatron's straggler reports: only the fastest and the slowest rank, each time."""
    return [RankTimings(step=10 * i, time=float(i), subrun=subrun,
                        seconds={fastest: fast_ms / 1000, (slowest(i) if callable(slowest) else slowest): slow_ms / 1000})
            for i in range(1, n + 1)]


def test_a_rank_that_is_the_slowest_in_every_partial_report_is_a_straggler():
    found = feed(StragglerDetector(StragglerConfig(), NODES), timings(30, slowest=5))
    assert len(found) == 1 and found[0].ranks == (5,) and found[0].nodes == (NODES[5],)


def test_the_slowest_place_changing_hands_names_no_straggler():
    assert feed(StragglerDetector(StragglerConfig(), NODES), timings(60, slowest=lambda i: 3 + i % 4)) == []


def test_partial_reports_within_the_ratio_name_no_straggler():
    assert feed(StragglerDetector(StragglerConfig(), NODES), timings(30, slowest=5, slow_ms=1200.0)) == []


def test_each_ranks_peers_median_is_the_median_of_the_others_at_any_count():
    import statistics

    from runmgr.watch.robust_stats import medians_without_each

    for values in ([1.0, 3.0], [2.0, 1.0, 3.0], [5.0, 1.0, 1.0, 2.0], [0.9, 1.1, 1.0, 3.0, 1.0, 1.2, 0.8],
                   [float(i % 7) for i in range(40)]):
        assert medians_without_each(values) == [statistics.median(values[:i] + values[i + 1:])
                                                for i in range(len(values))]
