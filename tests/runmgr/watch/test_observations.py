"""Observations built from the trainer's reports."""

from __future__ import annotations

from trainer.report import Heartbeat, StepReport

from runmgr.watch.observations import HeartbeatObservation, StepObservation, onset_position


def report(step, skipped=False):
    return StepReport(subrun="12.03", step=step, loss=2.5, grad_norm=float("inf") if skipped else 0.7, lr=1e-4,
                      loss_scale=1024.0, tokens=32768, consumed_samples=step * 16, step_time=0.25,
                      compute_times=(0.2, 0.21), skipped=skipped, time=1000.0 + step)


def test_a_step_report_becomes_an_observation_with_its_throughput():
    obs = StepObservation.from_report(report(7, skipped=True))
    assert (obs.step, obs.subrun, obs.consumed_samples, obs.compute_times) == (7, "12.03", 112, (0.2, 0.21))
    assert obs.tokens_per_s == 32768 / 0.25 and obs.skipped and obs.skipped_iterations == 1


def test_a_heartbeat_is_placed_on_its_node():
    beat = HeartbeatObservation.from_heartbeat(Heartbeat(rank=3, phase="checkpoint", step=40, time=5.0), "node-1",
                                               "12.03")
    assert (beat.rank, beat.phase, beat.node, beat.subrun) == (3, "checkpoint", "node-1", "12.03")


def test_onset_position_is_where_the_first_covered_step_starts_in_the_stream():
    previous = StepObservation(step=90, time=0.0, consumed_samples=90 * 16)
    line = StepObservation(step=100, time=1.0, consumed_samples=100 * 16, iterations=10)
    assert onset_position(previous, line) == (91, 90 * 16, 16)
    assert onset_position(None, line) == (91, None, None)
    with_batch = StepObservation(step=100, time=1.0, consumed_samples=1600, global_batch=16, iterations=10)
    assert onset_position(None, with_batch) == (91, 1440, 16)
