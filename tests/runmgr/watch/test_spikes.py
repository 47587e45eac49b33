"""Loss and grad-norm spikes on realistic noisy traces."""

from __future__ import annotations

import dataclasses

import pytest

from runmgr.config.watcher import SpikeConfig, WatcherConfig
from runmgr.watch.incidents import GRAD_SPIKE, LOSS_SPIKE
from runmgr.watch.spikes import SpikeDetector
from runmgr.watch.watcher import Watcher


def run(detector, observations):
    return [incident for obs in observations for incident in detector.update(obs, obs.time)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_clean_noisy_traces_raise_no_incident_of_any_kind(trace, seed):
    watcher = Watcher(WatcherConfig())
    incidents = [i for obs in trace(4000, seed) for i in watcher.observe(obs, obs.time)]
    assert incidents == []


def test_a_spike_that_recovers_within_the_grace_window_is_reported_as_recovered(trace):
    found = run(SpikeDetector("loss", LOSS_SPIKE, SpikeConfig()), trace(1500, 7, spikes=((1000, 12, 0.5),)))
    assert len(found) == 1
    spike = found[0]
    assert spike.recovered
    assert spike.onset_step == 1000
    assert 1000 <= spike.peak_step < 1012
    assert spike.evidence["peak_rise"] > 0.4
    assert spike.evidence["resolved_step"] - 1000 <= SpikeConfig().grace_steps


def test_a_persistent_spike_is_reported_once_at_the_end_of_the_grace_window(trace):
    found = run(SpikeDetector("loss", LOSS_SPIKE, SpikeConfig()), trace(2000, 8, spikes=((1200, 5000, 0.4),)))
    assert len(found) == 1
    spike = found[0]
    assert not spike.recovered
    assert spike.onset_step == 1200
    assert spike.evidence["resolved_step"] == 1200 + SpikeConfig().grace_steps
    # Stream position where the onset step's batch starts, for the skip window.
    assert spike.onset_sample == 1199 * 128 and spike.samples_per_step == 128
    assert "persistent" in spike.description


def test_spike_longer_than_grace_but_recovering_later_is_still_persistent(trace):
    grace = SpikeConfig().grace_steps
    found = run(SpikeDetector("loss", LOSS_SPIKE, SpikeConfig()), trace(1500, 9, spikes=((900, grace + 30, 0.5),)))
    assert [i.recovered for i in found] == [False]


def test_a_slow_divergence_is_caught_by_its_rising_rolling_median(trace):
    observations = trace(1600, 10)
    drifted = [dataclasses.replace(o, loss=o.loss * (1 + max(0, o.step - 1000) * 0.002)) for o in observations]
    found = run(SpikeDetector("loss", LOSS_SPIKE, SpikeConfig()), drifted)
    assert len(found) == 1 and not found[0].recovered and found[0].evidence["drift"]
    # The onset is where the rolling median was lowest: where the drift began.
    assert 950 <= found[0].onset_step <= 1060
    assert found[0].evidence["rolling_median"] > 1.1 * found[0].evidence["lowest_median"]


def test_drift_detection_can_be_switched_off(trace):
    observations = trace(1600, 10)
    drifted = [dataclasses.replace(o, loss=o.loss * (1 + max(0, o.step - 1000) * 0.002)) for o in observations]
    assert run(SpikeDetector("loss", LOSS_SPIKE, SpikeConfig(drift_rise=None)), drifted) == []


def test_grad_norm_spike_is_its_own_kind(trace):
    found = run(SpikeDetector("grad_norm", GRAD_SPIKE, WatcherConfig().grad_spike),
                trace(1500, 11, spikes=((1100, 8, 0.0),)))
    assert [(i.kind, i.recovered, i.onset_step) for i in found] == [(GRAD_SPIKE, True, 1100)]


def test_a_new_subrun_drops_the_open_episode(trace):
    detector = SpikeDetector("loss", LOSS_SPIKE, SpikeConfig())
    before = trace(1230, 12, spikes=((1200, 5000, 0.5),))
    assert run(detector, before) == []  # still inside the grace window when the sub-run ends
    resumed = trace(300, 13, subrun="1.01", start=1101)
    assert run(detector, resumed) == []


def test_a_restart_from_a_checkpoint_inside_the_spike_keeps_the_episode(trace):
    """A worker lost in the middle of a garbage window: the next sub-run resumes
    from a checkpoint taken after the onset; the spike is still the lineage's and
    is reported as persistent at the end of its grace window, with its onset."""
    detector = SpikeDetector("loss", LOSS_SPIKE, SpikeConfig())
    grace = SpikeConfig().grace_steps
    before = trace(1220, 12, spikes=((1200, 5000, 0.5),))
    assert run(detector, before) == []  # still inside the grace window when the sub-run ends
    resumed = trace(300, 13, subrun="1.01", start=1211, spikes=((1200, 5000, 0.5),))  # checkpoint 1210
    found = run(detector, resumed)
    assert [(i.recovered, i.onset_step) for i in found] == [(False, 1200)]
    assert found[0].evidence["resolved_step"] == 1200 + grace
    assert found[0].evidence["baseline_median"] < 2.6  # ~2.47 before the spike; the spike sits at ~3.7


def what_was_seen(incidents):
    return [(i.kind, i.onset_step, i.peak_step, i.recovered, i.evidence["resolved_step"]) for i in incidents]


@pytest.mark.parametrize("resume, ran_past", [(1150, 30), (1195, 20), (1205, 20), (1230, 40), (1405, 10)])
def test_a_lineage_resumed_from_a_checkpoint_sees_what_an_uninterrupted_run_sees(trace, resume, ran_past):
    """The sub-run ends ``ran_past`` steps after checkpoint ``resume`` and the next one
    redoes them (bit for bit, as the trainer does): from the resume on, the detector
    reports exactly what it reports on the uninterrupted curve, before, inside or after
    a persistent spike (onset 1200), a recovered one (1400) and a slow drift (from 1600)."""
    observations = trace(1900, 21, spikes=((1200, 60, 0.5), (1400, 8, 0.5)))
    observations = [dataclasses.replace(o, loss=o.loss * (1 + max(0, o.step - 1600) * 0.002)) for o in observations]
    uninterrupted = run(SpikeDetector("loss", LOSS_SPIKE, SpikeConfig()), observations)
    assert [(onset // 10, recovered) for _, onset, _, recovered, _ in what_was_seen(uninterrupted)] == [
        (120, False), (140, True), (160, False)]
    detector = SpikeDetector("loss", LOSS_SPIKE, SpikeConfig())
    run(detector, observations[:resume + ran_past])
    redone = [dataclasses.replace(o, subrun="1.01") for o in observations[resume:]]
    after_resume = [i for i in uninterrupted if i.evidence["resolved_step"] > resume]
    assert what_was_seen(run(detector, redone)) == what_was_seen(after_resume)


def test_after_a_rollback_from_a_drift_the_clean_subrun_is_not_reported_again(trace):
    detector = SpikeDetector("loss", LOSS_SPIKE, SpikeConfig())
    drifted = [dataclasses.replace(o, loss=o.loss * (1 + max(0, o.step - 1000) * 0.002)) for o in trace(1200, 15)]
    assert len(run(detector, drifted)) == 1
    resumed = trace(600, 16, subrun="1.01", start=901)
    assert run(detector, resumed) == []
    # ...while a new divergence in the new sub-run is still caught against the old floor.
    again = [dataclasses.replace(o, loss=o.loss * (1 + max(0, o.step - 1600) * 0.003), subrun="1.02")
             for o in trace(400, 17, start=1501)]
    assert len(run(detector, again)) == 1


def test_no_judgement_before_min_history(trace):
    config = SpikeConfig(min_history=50)
    found = run(SpikeDetector("loss", LOSS_SPIKE, config), trace(200, 14, spikes=((30, 5, 3.0),)))
    assert found == []


def test_a_loss_that_falls_for_a_long_run_keeps_the_detectors_memory_bounded_and_a_late_drift_is_caught(trace):
    # A falling pretraining loss sets a new lowest rolling median nearly every step: what the
    # detector keeps of them is bounded (a 54-day run has 777,600 steps), the drift still caught.
    observations = trace(12000, 4)
    falling = [dataclasses.replace(o, loss=o.loss * (2.0 - o.step / 10000) * (1 + max(0, o.step - 10000) * 0.002))
               for o in observations]
    detector = SpikeDetector("loss", LOSS_SPIKE, SpikeConfig())
    found = run(detector, falling)
    assert len(detector._floors) <= detector._floors.maxlen < 12000
    assert len(found) == 1 and found[0].evidence["drift"] and 9900 <= found[0].onset_step <= 10100
