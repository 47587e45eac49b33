"""runmgr's own trainer's log, as its PrintingReporter prints it (trainer/cli.py), read back as
observations: steps with their figures, a NaN or an overflow-skipped step, checkpoints, and a start
from a checkpoint (the job restarted)."""

from __future__ import annotations

import io
import math

import pytest

from trainer.cli import PrintingReporter
from trainer.report import CheckpointReport, StartReport, StepReport

from runmgr.watch.observations import CheckpointObservation, LoadedCheckpoint, StepObservation
from runmgr.watch.trainer_log import TrainerLogReader


def printed(*reports) -> list[str]:
    out = io.StringIO()
    reporter = PrintingReporter(train_iters=200, out=out)
    for report in reports:
        {StepReport: reporter.step, CheckpointReport: reporter.checkpoint, StartReport: reporter.started}[
            type(report)](report)
    return out.getvalue().splitlines()


def step(n: int, loss: float = 2.5, skipped: bool = False) -> StepReport:
    return StepReport(subrun="1.00", step=n, loss=loss, grad_norm=1.25, lr=3e-4, loss_scale=32768.0, tokens=1024,
                      consumed_samples=16 * n, step_time=0.063, compute_times=(), skipped=skipped, time=0.0)


def test_the_trainer_s_own_lines_are_its_steps_checkpoints_and_restarts():
    start = StartReport(subrun="1.01", start_step=40, resumed_from="checkpoints/demo/step_00000040",
                        consumed_samples=640, optimizer=({"name": "decay", "betas": [0.9, 0.95], "eps": 1e-8,
                                                          "weight_decay": 0.1, "step": 40},),
                        loss_scale=32768.0, lr_scale=1.0, clip_grad=1.0, reset_optimizer=False, skip_ranges=(),
                        time=0.0)
    lines = printed(start, step(41), step(42, loss=math.nan, skipped=True),
                    CheckpointReport(subrun="1.01", step=42, path="checkpoints/demo/step_00000042", seconds=0.05,
                                     time=0.0))
    reader = TrainerLogReader("1.01")
    loaded, first, second, saved = [reader.parse(line, received_at=100.0 + n) for n, line in enumerate(lines)]
    assert isinstance(loaded, LoadedCheckpoint) and loaded.step == 40 and loaded.path.endswith("step_00000040")
    assert isinstance(first, StepObservation) and (first.step, first.loss, first.grad_norm) == (41, 2.5, 1.25)
    assert (first.lr, first.loss_scale, first.consumed_samples, first.step_time) == (3e-4, 32768.0, 656, 0.063)
    assert first.time == 101.0 and first.skipped_iterations == 0 and first.nan_iterations == 0
    assert math.isnan(second.loss) and second.skipped_iterations == 1 and second.nan_iterations == 1
    assert isinstance(saved, CheckpointObservation) and saved.step == 42 and saved.consumed_samples == 672
    assert reader.take_refused() == []


def test_without_arrival_times_the_clock_adds_the_step_times_and_other_lines_are_nothing():
    reader = TrainerLogReader()
    times = [reader.parse(line).time for line in printed(step(1), step(2), step(3))]
    assert times == pytest.approx([0.063, 0.126, 0.189])
    assert reader.parse("local norms step 3: 16 weights, largest embedding.weight 2.83") is None
    assert reader.parse("start at step 0 from initialisation | decay: ...") is None
